"""The ``APPLY`` script's prelude (``router.index.redis_lua``): its arguments as locals,
the string helpers on holders strings and row fields, and the call's own state (key-set
adds, summed counters, reused tables); and the metadata version's bump, which ``APPLY``,
``FREE`` (here) and the client's pipelines (``BUMP``) share.

Split from ``router.index.redis_lua`` along the seam between the helpers and the op loop;
the layout they work on is described there.
"""

from __future__ import annotations

# A shard's metadata version ``X..'ver'`` (clients cache the workers' metadata and slots
# by it, ``router.index.redis_meta``) moves at every metadata or slot change to
# max(current + 1, the server's clock in microseconds). Why not a counter: an INCR counts
# again from 0 on a Redis that lost its data (flushed, restarted empty), so after as many
# changes as before, a replica's cached version was "current" again over other content
# (slots handed out in another order). While the key lives the version only grows
# (whatever the clock does); after a loss it starts again at the clock, above every
# version handed out before -- each was its bump's clock reading, or a step or two above
# where bumps shared one (Valkey freezes TIME within a script; one bump per script here)
# -- unless the server's clock went back past them. Scripts may read TIME and then write:
# Redis >= 7 and Valkey replicate a script's effects. Every bump goes through
# ``bump_ver`` (in ``APPLY`` and ``FREE``; ``BUMP`` for the client's own pipelines,
# ``router.index.redis``).
BUMP_VER = r"""
local function bump_ver(V)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local v = math.max((tonumber(redis.call('GET', V) or '0') or 0) + 1, now)
  -- '%.0f': a Lua number above 1e14 would otherwise go out in exponent form
  redis.call('SET', V, string.format('%.0f', v))
  return v
end
"""

# KEYS[1] = X..'ver': one bump (``BUMP_VER``), the new version returned.
BUMP = BUMP_VER + "return bump_ver(KEYS[1])\n"

# Free a removed worker's slot (its rows were left by the clear before): KEYS[1] =
# X..'slot', ARGV[1] = X, ARGV[2] = worker id.
FREE = (
    BUMP_VER
    + r"""
local s = redis.call('HGET', KEYS[1], ARGV[2])
if s then
  redis.call('HDEL', KEYS[1], ARGV[2])
  redis.call('ZADD', ARGV[1] .. 'free', s, s)
  bump_ver(ARGV[1] .. 'ver')
end
return s
"""
)

# Prepended to the op loop: ``APPLY = APPLY_PRELUDE + ...`` (one script). The per-call
# state below is created before the epoch check; a refused call only allocated it.
APPLY_PRELUDE = (
    BUMP_VER
    + r"""
local P = ARGV[1]
local CAP = tonumber(ARGV[2])
local X = ARGV[3]
local W = ARGV[4]
local REV = KEYS[1]
local sub, find, byte, char = string.sub, string.find, string.byte, string.char
local gmatch = string.gmatch
local band = bit.band
local stored, repeat_, removed, missing = 0, 0, 0, 0
local code = nil
local CM = {}  -- the worker's holder entry per mask: code .. char(mask)
local function slot_code()
  if code then return code end
  local s = redis.call('HGET', X .. 'slot', W)
  if not s then
    local f = redis.call('ZPOPMIN', X .. 'free')
    if #f > 0 then s = f[1] else s = redis.call('INCR', X .. 'next') - 1 end
    redis.call('HSET', X .. 'slot', W, s)
    bump_ver(X .. 'ver')
  end
  s = tonumber(s)
  code = char(8 + math.floor(s / 248), 8 + s % 248)
  for m = 1, 7 do CM[m] = code .. char(m) end
  return code
end
-- The worker's mask in a holders string (0: not held) and its position.
local function mask_in(v)
  if not v then return 0, nil end
  local p = find(v, code, 1, true)
  if p then return byte(v, p + 2), p end
  return 0, nil
end
-- The holders string with the worker's mask set to m (0 drops the worker).
local function with_mask(v, p, m)
  if p then
    if m == 0 then return sub(v, 1, p - 1) .. sub(v, p + 3) end
    return sub(v, 1, p - 1) .. CM[m] .. sub(v, p + 3)
  end
  return (v or '') .. CM[m]
end
-- Row fields: a key's last 6 bytes (redis_codec.ROW_KEY_BYTES); ``ks`` from i to j.
local function rows_of(ks, i, j)
  local t = {}
  for q = i or 1, j or #ks do t[#t + 1] = sub(ks[q], 3, 8) end
  return t
end
local function write_rows(XG, upd, gone)
  if #upd > 0 then redis.call('HSET', XG, unpack(upd)) end
  if #gone > 0 then redis.call('HDEL', XG, unpack(gone)) end
end
-- Take the worker out of every shared row it is in (a clear).
local function leave_rows(pairs_gb)
  for _, gb in ipairs(pairs_gb) do
    local g, bs = string.match(gb, '^(%S+) (%S+)$')
    if g then  -- else a key name, written before round 4b
      local XG = X .. 'x:' .. g
      local ks = redis.call('HVALS', P .. 'e:' .. bs)
      for lo = 1, #ks, 2000 do
        local hi = math.min(#ks, lo + 1999)
        local vs = redis.call('HMGET', XG, unpack(rows_of(ks, lo, hi)))
        local upd, gone, seen = {}, {}, {}
        for j = lo, hi do
          local k = ks[j]
          local m, p = mask_in(vs[j - lo + 1])
          if p and not seen[k] then
            seen[k] = true
            local v = with_mask(vs[j - lo + 1], p, 0)
            local f = sub(k, 3, 8)
            if v == '' then gone[#gone + 1] = f else upd[#upd + 1] = f; upd[#upd + 1] = v end
          end
        end
        write_rows(XG, upd, gone)
      end
    end
  end
end
-- Per call: names already added to the key sets, and the hashes blob (with its block
-- size) whose resolved keys and row fields KS / RK hold (a hybrid model stores the same
-- blocks into each group of a block size: the second op reuses the first's lookup; any
-- removal or clear forgets it).
local added, kraw, kbs = {}, nil, nil
-- Tables the ops of the call reuse (arrays with explicit lengths; CUR emptied after
-- each op): Lua 5.1 grows a fresh table by rehashing it at every power of two,
-- which was a tenth of the script's instructions.
local HS, KS, RK, NEWMAP, UPD, CUR = {}, {}, {}, {}, {}, {}
-- The removal path's: per distinct key and per gone key (see there).
local POS, VAL, OWNER, EM, GQ, GF, THERE, DQ, HSD = {}, {}, {}, {}, {}, {}, {}, {}, {}
local function note(name)
  if not added[name] then
    redis.call('SADD', REV, name)
    added[name] = true
  end
end
-- Count changes of the call per ``n:g`` hash and field, written once at its end (or
-- before a clear): one HINCRBY per op and field was a third of the script's calls.
local counts, cnames = {}, {}
local function count(N, f, d)
  local t = counts[N]
  if not t then
    t = {}
    counts[N] = t
    cnames[#cnames + 1] = N
  end
  t[f] = (t[f] or 0) + d
end
local function flush_counts()
  for _, N in ipairs(cnames) do
    for f, d in pairs(counts[N]) do
      if d ~= 0 then redis.call('HINCRBY', N, f, d) end
    end
  end
  counts, cnames = {}, {}
end
-- Per call: whether a worker's copies hash exists, and a ghost generation's size.
local has_copies, ghosts = {}, {}
-- A batch boundary "4 rank seq fingerprint [follows]": 1 apply (noted in SEQ, ranks), 0
-- skip (applied already), -1 defer (a newer seq whose predecessor ``follows``, absent:
-- any, is not the rank's last; the replica that cleared the worker rebuilds it in order),
-- and the rank's last seq as read ('-1': none). router.index.base.seq_verdict has the same
-- rule. Reads only: the seqs are written last, once every write of the call went through
-- (Redis keeps what a failing script wrote, so a batch noted first stayed "applied").
local function seq_boundary(S, SEQ, ranks, hdr)
  local r, last, lastraw = hdr[2], nil, nil
  if SEQ[r] then
    last, lastraw = SEQ[r][1], SEQ[r][3]
  else
    local cur = redis.call('HGET', S, r)
    if cur then
      lastraw = string.match(cur, '^(-?%d+)')
      last = tonumber(lastraw)
    end
  end
  local f = hdr[5]
  if last ~= nil and tonumber(hdr[3]) <= last then return 0, lastraw end
  if f ~= nil and f ~= '-2' and f ~= (lastraw or '-1') then return -1, lastraw or '-1' end
  if not SEQ[r] then ranks[#ranks + 1] = r end
  SEQ[r] = {tonumber(hdr[3]), hdr[3] .. ':' .. hdr[4], hdr[3]}
  return 1, lastraw
end
"""
)
