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
the next new slot; ``X..'ver'`` the metadata version every metadata or slot change moves
up (clients cache metadata by it; never reused, even after a loss: ``redis_lua_lib``);
``X..'state'`` / ``X..'plan'`` hashes worker -> msgpack metadata / "g,bs,full;..." (read
by a score in one HMGET each).

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

from router.index.redis_lua_lib import APPLY_PRELUDE, BUMP, FREE

__all__ = ["APPLY", "BUMP", "FREE"]

# KEYS[1] = P..'keys'. ARGV[1] = P, ARGV[2] = ghost generation size, ARGV[3] = X,
# ARGV[4] = worker id. Then a flat op list, each op starting with one header argument
# of space-separated decimals:
#   "1 group bs bit n hw nsib sib..." (store), then hashes, then keys
#   "2 group bs bit n hw nsib sib..." (remove), then hashes
#   "3 epoch [1]" (clear; the worker's cache epoch becomes ``epoch``, see
#   RedisIndex.resolve; with 1 its recorded seqs go too, in the same call)
#   "4 rank seq fingerprint [follows]" (a batch boundary: skip to the next if seq is not
#   new, or if ``follows`` is not the rank's last seq: ``SeqOp``; recorded after every
#   other write of the call)
#   "5 epoch..." (only first: the worker's epoch must still be one of these, else nothing
#   is written and the reply ends with 1 -- the client planned from stale cached mappings)
# ``hashes`` is one blob of n encoded engine hashes of width hw, or (hw = 0) n separate
# arguments; ``keys`` is one blob of n 8-byte keys. Each op costs a handful of
# HMGET/HSET calls whatever its size: per-block redis.call overhead dominated before.
# Returns {stored, stored_repeat, removed, removed_missing, skipped_batches, epoch, 0,
# deferred_batches, deferred_at}: ``epoch`` is the worker's ``P..'meta'`` field after the
# call (replicas drop cached mappings of a worker whose epoch another replica changed).
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
local nargs = #ARGV
local S = P .. 's'
local skip, skipped, deferred, deferred_at = false, 0, 0, '-1'
-- rank -> {seq, "seq:fingerprint"} of the last batch applied here, and the ranks in order
local SEQ, ranks = {}, {}
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
    -- A batch boundary (seq_boundary, in the prelude): apply what follows only if it is
    -- new for the rank and follows the rank's last seq; recorded last (see there).
    local v, at = seq_boundary(S, SEQ, ranks, hdr)
    skip = v ~= 1
    if v == 0 then
      skipped = skipped + 1
    elseif v < 0 then
      deferred, deferred_at = deferred + 1, at
    end
  elseif skip then
    -- Consume the skipped op's arguments without running it.
    if op == '1' or op == '2' then
      local n, hw = tonumber(hdr[5]), tonumber(hdr[6])
      i = i + (hw > 0 and 1 or n) + (op == '1' and 1 or 0)
    end
  elseif op == '3' then
    flush_counts()
    -- Before round 4b the key set held key names and ``gs`` the pairs: a clear of such a
    -- worker still leaves its rows and unlinks every name (docs/router.md: flush anyway).
    local gbs = redis.call('SMEMBERS', REV)
    for _, gb in ipairs(redis.call('SMEMBERS', P .. 'gs')) do gbs[#gbs + 1] = gb end
    leave_rows(gbs)
    for _, gb in ipairs(gbs) do
      local g, bs = string.match(gb, '^(%S+) (%S+)$')
      if g then
        redis.call('UNLINK', P .. 'n:' .. g, P .. 'c:' .. g, P .. 'e:' .. bs,
          P .. 't:' .. bs, P .. 'u:' .. bs)
      else
        redis.call('UNLINK', gb)
      end
    end
    redis.call('DEL', REV, P .. 'gs')
    added, kraw, has_copies, ghosts = {}, nil, {}, {}
    if hdr[2] then redis.call('HSET', P .. 'meta', 'epoch', hdr[2]) end
    if hdr[3] == '1' then  -- a resync: the batches recorded go with the entries
      redis.call('DEL', S)
      SEQ, ranks = {}, {}
    end
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
      kraw = nil  -- the map may lose entries here; HS, KS, RK are reused below
      if hraw then
        for j = 0, n - 1 do HS[j + 1] = sub(hraw, j * hw + 1, j * hw + hw) end
      else
        for j = 1, n do HS[j] = hs[j] end
      end
      local ks = redis.call('HMGET', E, unpack(HS, 1, n))
      -- The distinct mapped keys in order: KS[q], its row field RK[q], holders VAL[q];
      -- CUR: key -> q (emptied below), POS[j]: the q of the j-th hash (false: unmapped).
      local nq = 0
      for j = 1, n do
        local k = ks[j]
        if k then
          local q = CUR[k]
          if q == nil then
            nq = nq + 1
            q = nq
            CUR[k] = q
            KS[q] = k
            RK[q] = sub(k, 3, 8)
          end
          POS[j] = q
        else
          POS[j] = false
        end
      end
      for q = 1, nq do CUR[KS[q]] = nil end
      local gone_bits = 0
      if nq > 0 then
        local vs = redis.call('HMGET', XG, unpack(RK, 1, nq))
        for q = 1, nq do
          VAL[q] = vs[q] or ''
          OWNER[q] = false  -- the engine hash whose removal cleared the bit
        end
        -- Copies beyond the first (vLLM keeps duplicates): a removal takes one copy,
        -- and the medium's bit goes only with the last.
        local C = P .. 'c:' .. g
        local extra, touched = nil, nil
        local hc = has_copies[C]
        if hc == nil then
          hc = redis.call('EXISTS', C) == 1
          has_copies[C] = hc
        end
        if hc then
          local cf = {}
          for q = 1, nq do cf[q] = KS[q] .. CB end
          local cv = redis.call('HMGET', C, unpack(cf, 1, nq))
          extra = {}
          for q = 1, nq do
            if cv[q] then extra[q] = tonumber(cv[q]) end
          end
        end
        for j = 1, n do
          local q = POS[j]
          if q then
            local v = VAL[q]
            local m, p = mask_in(v)
            if band(m, b) ~= 0 then
              local e = extra and extra[q]
              if e and e > 0 then
                extra[q] = e - 1
                touched = touched or {}
                touched[q] = true
              else
                VAL[q] = with_mask(v, p, m - b)
                OWNER[q] = HS[j]
              end
              changed = changed + 1
            end
          end
        end
        if touched then
          for q, _ in pairs(touched) do
            if extra[q] > 0 then
              redis.call('HSET', C, KS[q] .. CB, extra[q])
            else
              redis.call('HDEL', C, KS[q] .. CB)
            end
          end
        end
        local nu, ne, ngo = 0, 0, 0
        for q = 1, nq do
          if OWNER[q] then
            gone_bits = gone_bits + 1
            local v = VAL[q]
            if v == '' then
              ne = ne + 1
              EM[ne] = RK[q]
            else
              UPD[nu + 1] = RK[q]
              UPD[nu + 2] = v
              nu = nu + 2
            end
            if mask_in(v) == 0 then
              ngo = ngo + 1
              GQ[ngo] = q
            end
          end
        end
        if nu > 0 then redis.call('HSET', XG, unpack(UPD, 1, nu)) end
        if ne > 0 then redis.call('HDEL', XG, unpack(EM, 1, ne)) end
        if ngo > 0 then
          count(N, 'k', -ngo)
          for t = 1, ngo do
            GF[t] = RK[GQ[t]]
            THERE[t] = false
          end
          for s = 8, #hdr do  -- the sibling groups' rows: a block still there keeps its map
            local there = redis.call('HMGET', X .. 'x:' .. hdr[s], unpack(GF, 1, ngo))
            for t = 1, ngo do
              if mask_in(there[t]) ~= 0 then THERE[t] = true end
            end
          end
          local nd = 0
          for t = 1, ngo do
            if not THERE[t] then
              nd = nd + 1
              DQ[nd] = GQ[t]
              HSD[nd] = OWNER[GQ[t]]
            end
          end
          if nd > 0 then
            local T = P .. 't:' .. bs
            redis.call('HDEL', E, unpack(HSD, 1, nd))
            local size = ghosts[T] or redis.call('HLEN', T)
            -- Chunks that can at most fill the generation: the rename happens after the
            -- same mapping as one HSET per mapping would (each adds at most one field).
            local j = 1
            while j <= nd do
              local last = math.min(nd, j + math.max(CAP - size, 1) - 1)
              local np = 0
              for q = j, last do
                NEWMAP[np + 1] = HSD[q]
                NEWMAP[np + 2] = KS[DQ[q]]
                np = np + 2
              end
              size = size + redis.call('HSET', T, unpack(NEWMAP, 1, np))
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
      if gone_bits > 0 then count(N, b, -gone_bits) end
    end
  end
end
flush_counts()
if #ranks > 0 then  -- last: the batches' seqs (see op '4')
  local kv = {}
  for _, r in ipairs(ranks) do
    kv[#kv + 1] = r
    kv[#kv + 1] = SEQ[r][2]
  end
  redis.call('HSET', S, unpack(kv))
end
return {stored, repeat_, removed, missing, skipped, redis.call('HGET', P .. 'meta', 'epoch'),
  0, deferred, deferred_at}
"""
)
