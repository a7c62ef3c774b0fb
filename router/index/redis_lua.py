"""Server-side Lua of the Redis index's write side: one script call per batch.

Inverted layout (why: a score then reads one hash field per request block and group,
whatever the worker count -- ``router.index.redis_read``). Workers are split into shards
(one on a single server); every key of a shard shares its hash tag, ``kvroute:{ix:<n>}:``
(``X``), so every write script runs in one Redis Cluster slot.

Shared by the shard's workers: ``X..'x:'..g`` hash key (its last 6 bytes,
``redis_codec.ROW_KEY_BYTES``) -> the holders of that block in
group ``g``: 3 bytes per worker slot holding it, ``code(slot)`` (2 bytes, each >= 8)
then the media mask (1..7). A mask byte is < 8 and a code byte >= 8, so a plain
``string.find`` of a code can only match at a holder's boundary (C speed, no scan).
``X..'slot'`` hash worker -> slot, ``X..'free'`` zset of freed slots, ``X..'next'``
the next new slot; ``X..'ver'`` a counter every metadata or slot change increments
(clients cache metadata by it); ``X..'state'`` / ``X..'plan'`` hashes worker -> msgpack metadata /
"g,bs,full;..." (read by a score in one HMGET each).

Per worker ``P = X..'w:'..<id>..':'``: ``P..'meta'`` hash {epoch: a random token set when
the worker is created and at every clear} · ``P..'n:'..g`` hash bit -> block count, 'k'
-> keys held on any medium · ``P..'c:'..g`` hash key..bit -> copies beyond the first
(vLLM keeps duplicates) · ``P..'e:'..bs`` hash engine hash -> key · ``P..'s'`` hash rank
-> "seq:fingerprint" of the last applied batch (not derived from ``keys``: an in-stream
clear keeps it) · ``P..'t:'..bs`` / ``P..'u:'..bs`` ghost mappings of blocks gone from
every tier (newer / older generation) · ``P..'keys'`` set of "g bs" the worker stored
into (the reverse structure: every data key name above derives from these pairs; a
clear walks ``e:bs`` to take the worker out of the shared rows, then unlinks the
``n:``/``c:``/``e:``/``t:``/``u:`` keys of each pair). One set add per pair and call,
not one per key name and op: an add was a tenth of the script's calls.
"""

from __future__ import annotations

from router.index.redis_lua_lib import APPLY_PRELUDE

# KEYS[1] = P..'keys'. ARGV[1] = P, ARGV[2] = ghost generation size, ARGV[3] = X,
# ARGV[4] = worker id. Then a flat op list, each op starting with one header argument
# of space-separated decimals:
#   "1 group bs bit n hw nsib sib..." (store), then hashes, then keys
#   "2 group bs bit n hw nsib sib..." (remove), then hashes
#   "3 epoch" (clear; the worker's cache epoch becomes ``epoch``, see RedisIndex.resolve)
#   "4 rank seq fingerprint" (a batch boundary: skip to the next one if seq is not new)
#   "5 epoch..." (only first: the worker's epoch must still be one of these, else nothing
#   is written and the reply ends with 1 -- the client planned from stale cached mappings)
# ``hashes`` is one blob of n encoded engine hashes of width hw, or (hw = 0) n separate
# arguments; ``keys`` is one blob of n 8-byte keys. Each op costs a handful of
# HMGET/HSET calls whatever its size: per-block redis.call overhead dominated before.
# Returns {stored, stored_repeat, removed, removed_missing, skipped_batches, epoch}:
# ``epoch`` is the worker's ``P..'meta'`` field after the call (replicas drop cached
# mappings of a worker whose epoch another replica changed).
APPLY = (
    APPLY_PRELUDE
    + r"""
-- "5 epoch..." first: the mappings the client resolved from its cache hold only under
-- those epochs; another replica cleared or re-created the worker since -> write nothing.
local i = 5
if sub(ARGV[5] or '', 1, 2) == '5 ' then
  local have = redis.call('HGET', P .. 'meta', 'epoch')
  local ok = false
  for e in string.gmatch(sub(ARGV[5], 3), '%S+') do
    if e == have then ok = true end
  end
  if not ok then return {0, 0, 0, 0, 0, have or '', 1} end
  i = 6
end
slot_code()
-- Per call: names already added to the key sets, and the hashes blob (with its block
-- size) whose resolved keys and row fields KS / RK hold (a hybrid model stores the same
-- blocks into each group of a block size: the second op reuses the first's lookup; any
-- removal or clear forgets it).
local added, kraw, kbs = {}, nil, nil
-- Tables the store ops of the call reuse (arrays with explicit lengths; CUR emptied
-- after each op): Lua 5.1 grows a fresh table by rehashing it at every power of two,
-- which was a tenth of the script's instructions.
local HS, KS, RK, NEWMAP, UPD, CUR = {}, {}, {}, {}, {}, {}
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
local nargs = #ARGV
local S = P .. 's'
local skip, skipped = false, 0
while i <= nargs do
  local hdr = {}
  local nh = 0
  for x in gmatch(ARGV[i], '-?%d+') do
    nh = nh + 1
    hdr[nh] = x
  end
  i = i + 1
  local op = hdr[1]
  if op == '4' then
    -- A batch boundary: apply what follows only if this seq is new for the rank.
    local cur = redis.call('HGET', S, hdr[2])
    local last = nil
    if cur then last = tonumber(string.match(cur, '^(-?%d+)')) end
    skip = last ~= nil and tonumber(hdr[3]) <= last
    if skip then
      skipped = skipped + 1
    else
      redis.call('HSET', S, hdr[2], hdr[3] .. ':' .. hdr[4])
    end
  elseif skip then
    -- Consume the skipped op's arguments without running it.
    if op == '1' or op == '2' then
      local n, hw = tonumber(hdr[5]), tonumber(hdr[6])
      i = i + (hw > 0 and 1 or n) + (op == '1' and 1 or 0)
    end
  elseif op == '3' then
    flush_counts()
    local gbs = redis.call('SMEMBERS', REV)
    leave_rows(gbs)
    for _, gb in ipairs(gbs) do
      local g, bs = string.match(gb, '^(%S+) (%S+)$')
      redis.call('UNLINK', P .. 'n:' .. g, P .. 'c:' .. g, P .. 'e:' .. bs, P .. 't:' .. bs,
        P .. 'u:' .. bs)
    end
    redis.call('DEL', REV)
    added, kraw, has_copies, ghosts = {}, nil, {}, {}
    if hdr[2] then redis.call('HSET', P .. 'meta', 'epoch', hdr[2]) end
  else
    local g, bs, b = hdr[2], hdr[3], tonumber(hdr[4])
    local n, hw = tonumber(hdr[5]), tonumber(hdr[6])
    local hs, hraw
    if hw > 0 then
      -- Split only when needed: a hybrid model's second group reuses the first's keys.
      hraw = ARGV[i]
      i = i + 1
    else
      hs = {}
      for j = 1, n do hs[j] = ARGV[i + j - 1] end
      i = i + n
    end
    local XG, N, E = X .. 'x:' .. g, P .. 'n:' .. g, P .. 'e:' .. bs
    local CB = char(b)
    local changed, held = 0, 0
    if op == '1' then
      note(g .. ' ' .. bs)  -- first: a failing write (WRONGTYPE) then changes nothing
      if not (hraw and hraw == kraw and bs == kbs) then
        kraw, kbs = hraw, bs
        if hraw then
          for j = 0, n - 1 do HS[j + 1] = sub(hraw, j * hw + 1, j * hw + hw) end
        else
          for j = 1, n do HS[j] = hs[j] end
        end
        local kb = ARGV[i]
        for j = 0, n - 1 do KS[j + 1] = sub(kb, j * 8 + 1, j * 8 + 8) end
        local known = redis.call('HMGET', E, unpack(HS, 1, n))
        local nm = 0
        for j = 1, n do
          local kn = known[j]
          if kn then
            KS[j] = kn
          else
            NEWMAP[nm + 1] = HS[j]
            NEWMAP[nm + 2] = KS[j]
            nm = nm + 2
          end
        end
        if nm > 0 and redis.call('HSET', E, unpack(NEWMAP, 1, nm)) < nm / 2 then
          -- An engine hash twice among the new ones: its first key wins (as it would
          -- mapping one at a time), for the map and for the later occurrences.
          local first, fix, nf = {}, {}, 0
          for j = 1, n do
            if not known[j] then
              local h = HS[j]
              local k0 = first[h]
              if k0 then
                KS[j] = k0
              else
                first[h] = KS[j]
                fix[nf + 1] = h
                fix[nf + 2] = KS[j]
                nf = nf + 2
              end
            end
          end
          redis.call('HSET', E, unpack(fix, 1, nf))
        end
        for j = 1, n do RK[j] = sub(KS[j], 3, 8) end
      end
      i = i + 1
      local vs = redis.call('HMGET', XG, unpack(RK, 1, n))
      -- UPD: (row field, new holders) per distinct key, CUR: key -> its value's index.
      local nu, dup = 0, nil
      local CMB = CM[b]
      for j = 1, n do
        local k = KS[j]
        local pos = CUR[k]
        local v
        if pos == nil then
          v = vs[j]
          nu = nu + 2
          pos = nu
          CUR[k] = pos
          UPD[pos - 1] = RK[j]
        else
          v = UPD[pos]
        end
        if not v then  -- a block nobody holds yet
          UPD[pos] = CMB
          held = held + 1
          changed = changed + 1
        else
          local m, p = mask_in(v)
          if band(m, b) == 0 then
            if m == 0 then held = held + 1 end
            UPD[pos] = with_mask(v, p, m + b)
            changed = changed + 1
          else
            dup = dup or {}
            dup[#dup + 1] = k .. CB
            UPD[pos] = v
          end
        end
      end
      for j = 1, n do CUR[KS[j]] = nil end
      if changed > 0 then redis.call('HSET', XG, unpack(UPD, 1, nu)) end
      if dup then
        local C = P .. 'c:' .. g
        has_copies[C] = true
        for _, f in ipairs(dup) do redis.call('HINCRBY', C, f, 1) end
      end
      stored = stored + changed
      repeat_ = repeat_ + n - changed
      if changed > 0 then count(N, b, changed) end
      if held > 0 then count(N, 'k', held) end
    else
      kraw = nil  -- the map may lose entries here
      local sibs = {}
      for q = 8, #hdr do sibs[q - 7] = X .. 'x:' .. hdr[q] end
      local owner = {}  -- key -> engine hash of a bit cleared, for map clean-up
      hs = hs or split(hraw, hw, n)
      local ks = redis.call('HMGET', E, unpack(hs))
      local kl = {}
      for j = 1, n do if ks[j] then kl[#kl + 1] = ks[j] end end
      if #kl > 0 then
        local vs = redis.call('HMGET', XG, unpack(rows_of(kl)))
        local cur, order = {}, {}
        for j = 1, #kl do
          if cur[kl[j]] == nil then
            cur[kl[j]] = vs[j] or ''
            order[#order + 1] = kl[j]
          end
        end
        -- Copies beyond the first (vLLM keeps duplicates): a removal takes one copy,
        -- and the medium's bit goes only with the last.
        local C = P .. 'c:' .. g
        local extra = {}
        local hc = has_copies[C]
        if hc == nil then
          hc = redis.call('EXISTS', C) == 1
          has_copies[C] = hc
        end
        if hc then
          local cf = {}
          for j = 1, #order do cf[j] = order[j] .. CB end
          local cv = redis.call('HMGET', C, unpack(cf))
          for j = 1, #order do
            if cv[j] then extra[order[j]] = tonumber(cv[j]) end
          end
        end
        local touched, dirty = {}, {}
        for j = 1, n do
          local k = ks[j]
          if k then
            local m, p = mask_in(cur[k])
            if bit.band(m, b) ~= 0 then
              local e = extra[k]
              if e and e > 0 then
                extra[k] = e - 1
                touched[k] = true
              else
                cur[k] = with_mask(cur[k], p, m - b)
                dirty[k] = true
                owner[k] = hs[j]
              end
              changed = changed + 1
            end
          end
        end
        for k, _ in pairs(touched) do
          if extra[k] > 0 then
            redis.call('HSET', C, k .. CB, extra[k])
          else
            redis.call('HDEL', C, k .. CB)
          end
        end
        local upd, empty, gone = {}, {}, {}
        for _, k in ipairs(order) do
          if dirty[k] then
            local v = cur[k]
            local f = sub(k, 3, 8)
            if v == '' then empty[#empty + 1] = f else upd[#upd + 1] = f; upd[#upd + 1] = v end
            if mask_in(v) == 0 then gone[#gone + 1] = k end
          end
        end
        write_rows(XG, upd, empty)
        if #gone > 0 then
          count(N, 'k', -#gone)
          local there_ = {}
          for _, XS in ipairs(sibs) do
            local there = redis.call('HMGET', XS, unpack(rows_of(gone)))
            for j = 1, #gone do
              if mask_in(there[j]) ~= 0 then there_[gone[j]] = true end
            end
          end
          local drop = {}
          for _, k in ipairs(gone) do
            if not there_[k] then drop[#drop + 1] = k end
          end
          if #drop > 0 then
            local T = P .. 't:' .. bs
            local hs_ = {}
            for j, k in ipairs(drop) do hs_[j] = owner[k] end
            redis.call('HDEL', E, unpack(hs_))
            local size = ghosts[T] or redis.call('HLEN', T)
            -- Chunks that can at most fill the generation: the rename happens after the
            -- same mapping as one HSET per mapping would (each adds at most one field).
            local j = 1
            while j <= #drop do
              local last = math.min(#drop, j + math.max(CAP - size, 1) - 1)
              local pairs_ = {}
              for q = j, last do
                pairs_[#pairs_ + 1] = hs_[q]
                pairs_[#pairs_ + 1] = drop[q]
              end
              size = size + redis.call('HSET', T, unpack(pairs_))
              if size >= CAP then  -- a new generation of ghosts; the oldest goes
                redis.call('RENAME', T, P .. 'u:' .. bs)
                size = 0
              end
              j = last + 1
            end
            ghosts[T] = size
          end
        end
      end
      removed = removed + changed
      missing = missing + n - changed
      local gone_bits = 0
      for _, _ in pairs(owner) do gone_bits = gone_bits + 1 end
      if gone_bits > 0 then count(N, b, -gone_bits) end
    end
  end
end
flush_counts()
return {stored, repeat_, removed, missing, skipped, redis.call('HGET', P .. 'meta', 'epoch')}
"""
)

# Free a removed worker's slot (its rows were left by the clear before): KEYS[1] =
# X..'slot', ARGV[1] = X, ARGV[2] = worker id.
FREE = r"""
local s = redis.call('HGET', KEYS[1], ARGV[2])
if s then
  redis.call('HDEL', KEYS[1], ARGV[2])
  redis.call('ZADD', ARGV[1] .. 'free', s, s)
  redis.call('INCR', ARGV[1] .. 'ver')
end
return s
"""
