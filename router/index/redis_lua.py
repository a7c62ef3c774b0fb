"""Server-side Lua for the Redis index: one script call per batch, one per score and node.

Every key a script touches belongs to one worker and carries its hash tag
(``kvroute:{w:<id>}:...``), so a script runs on one Redis Cluster slot. Scripts build
their key names from the worker prefix (same slot, same node).

Layout of one worker ``P = kvroute:{w:<id>}:``:
``P..'meta'`` hash {state: msgpack metadata, plan: "g,bs,full;...", epoch: a random
token set when the worker is created and at every clear} ·
``P..'g:'..g`` hash key(8 bytes) -> media mask · ``P..'n:'..g`` hash bit -> block count ·
``P..'c:'..g`` hash key..bit -> copies beyond the first (vLLM keeps duplicates) ·
``P..'e:'..bs`` hash engine hash -> key · ``P..'s'`` hash rank -> "seq:fingerprint" of the
last applied batch (not in the key set: an in-stream clear keeps it) ·
``P..'t:'..bs`` / ``P..'u:'..bs`` ghost mappings of blocks gone from every tier (newer /
older generation) · ``P..'keys'`` set of the data key names above
(the reverse structure: clearing or deleting a worker unlinks exactly these).
"""

from __future__ import annotations

# KEYS[1] = P..'keys'. ARGV[1] = P, ARGV[2] = ghost generation size. Then a flat op list,
# each op starting with one header argument of space-separated decimals:
#   "1 group bs bit n hw nsib sib..." (store), then hashes, then keys
#   "2 group bs bit n hw nsib sib..." (remove), then hashes
#   "3 epoch" (clear; the worker's cache epoch becomes ``epoch``, see RedisIndex.resolve)
#   "4 rank seq fingerprint" (a batch boundary: skip to the next one if seq is not new)
# ``hashes`` is one blob of n encoded engine hashes of width hw, or (hw = 0) n separate
# arguments; ``keys`` is one blob of n 8-byte keys. Each op costs a handful of
# HMGET/HSET calls whatever its size: per-block redis.call overhead dominated before.
# One header instead of a field per argument: the client encodes each argument in
# Python, and ~9 per op was a measurable share of the router's ingest CPU.
# Returns {stored, stored_repeat, removed, removed_missing, skipped_batches, epoch}:
# ``epoch`` is the worker's ``P..'meta'`` field after the call (replicas drop cached
# mappings of a worker whose epoch another replica changed).
APPLY = r"""
local P = ARGV[1]
local CAP = tonumber(ARGV[2])
local REV = KEYS[1]
local stored, repeat_, removed, missing = 0, 0, 0, 0
local function split(blob, w, n)
  local t = {}
  for j = 0, n - 1 do t[j + 1] = string.sub(blob, j * w + 1, j * w + w) end
  return t
end
local i = 3
local nargs = #ARGV
local S = P .. 's'
local skip, skipped = false, 0
while i <= nargs do
  local hdr = {}
  for x in string.gmatch(ARGV[i], '-?%d+') do hdr[#hdr + 1] = x end
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
    local names = redis.call('SMEMBERS', REV)
    for _, name in ipairs(names) do redis.call('UNLINK', name) end
    redis.call('DEL', REV)
    if hdr[2] then redis.call('HSET', P .. 'meta', 'epoch', hdr[2]) end
  else
    local g, bs, b = hdr[2], hdr[3], tonumber(hdr[4])
    local n, hw, nsib = tonumber(hdr[5]), tonumber(hdr[6]), tonumber(hdr[7])
    local sibs = {}
    for s = 1, nsib do sibs[s] = P .. 'g:' .. hdr[7 + s] end
    local hs
    if hw > 0 then
      hs = split(ARGV[i], hw, n)
      i = i + 1
    else
      hs = {}
      for j = 1, n do hs[j] = ARGV[i + j - 1] end
      i = i + n
    end
    local G, N, E = P .. 'g:' .. g, P .. 'n:' .. g, P .. 'e:' .. bs
    local CB = string.char(b)
    local changed = 0
    if op == '1' then
      local ks = split(ARGV[i], 8, n)
      i = i + 1
      redis.call('SADD', REV, G, N, E)
      local known = redis.call('HMGET', E, unpack(hs))
      local pending, newmap = {}, {}
      for j = 1, n do
        local h = hs[j]
        if known[j] then
          ks[j] = known[j]
        elseif pending[h] then
          ks[j] = pending[h]
        else
          pending[h] = ks[j]
          newmap[#newmap + 1] = h
          newmap[#newmap + 1] = ks[j]
        end
      end
      if #newmap > 0 then redis.call('HSET', E, unpack(newmap)) end
      local ms = redis.call('HMGET', G, unpack(ks))
      local cur, upd, dup = {}, {}, {}
      for j = 1, n do
        local k = ks[j]
        local m = cur[k] or tonumber(ms[j] or '0')
        if bit.band(m, b) == 0 then
          m = m + b
          upd[#upd + 1] = k
          upd[#upd + 1] = m
          changed = changed + 1
        else
          dup[#dup + 1] = k .. CB
        end
        cur[k] = m
      end
      if #upd > 0 then redis.call('HSET', G, unpack(upd)) end
      if #dup > 0 then
        local C = P .. 'c:' .. g
        redis.call('SADD', REV, C)
        for _, f in ipairs(dup) do redis.call('HINCRBY', C, f, 1) end
      end
      stored = stored + changed
      repeat_ = repeat_ + n - changed
      if changed > 0 then redis.call('HINCRBY', N, b, changed) end
    else
      local owner = {}  -- key -> engine hash of a bit cleared, for map clean-up
      local ks = redis.call('HMGET', E, unpack(hs))
      local kl = {}
      for j = 1, n do if ks[j] then kl[#kl + 1] = ks[j] end end
      if #kl > 0 then
        local ms = redis.call('HMGET', G, unpack(kl))
        local cur, order = {}, {}
        for j = 1, #kl do
          if cur[kl[j]] == nil then
            cur[kl[j]] = tonumber(ms[j] or '0')
            order[#order + 1] = kl[j]
          end
        end
        -- Copies beyond the first (vLLM keeps duplicates): a removal takes one copy,
        -- and the medium's bit goes only with the last.
        local C = P .. 'c:' .. g
        local extra = {}
        if redis.call('EXISTS', C) == 1 then
          local cf = {}
          for j = 1, #order do cf[j] = order[j] .. CB end
          local cv = redis.call('HMGET', C, unpack(cf))
          for j = 1, #order do
            if cv[j] then extra[order[j]] = tonumber(cv[j]) end
          end
        end
        local touched = {}
        for j = 1, n do
          local k = ks[j]
          if k then
            local m = cur[k]
            if bit.band(m, b) ~= 0 then
              local e = extra[k]
              if e and e > 0 then
                extra[k] = e - 1
                touched[k] = true
              else
                cur[k] = m - b
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
        local upd, gone = {}, {}
        for _, k in ipairs(order) do
          if owner[k] then
            if cur[k] > 0 then
              upd[#upd + 1] = k
              upd[#upd + 1] = cur[k]
            else
              gone[#gone + 1] = k
            end
          end
        end
        if #upd > 0 then redis.call('HSET', G, unpack(upd)) end
        if #gone > 0 then
          redis.call('HDEL', G, unpack(gone))
          local held = {}
          for _, S in ipairs(sibs) do
            local there = redis.call('HMGET', S, unpack(gone))
            for j = 1, #gone do if there[j] then held[gone[j]] = true end end
          end
          local drop = {}
          for _, k in ipairs(gone) do
            if not held[k] then drop[#drop + 1] = k end
          end
          if #drop > 0 then
            local T = P .. 't:' .. bs
            local hs_ = {}
            for j, k in ipairs(drop) do hs_[j] = owner[k] end
            redis.call('HDEL', E, unpack(hs_))
            redis.call('SADD', REV, T, P .. 'u:' .. bs)
            local size = redis.call('HLEN', T)
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
          end
        end
      end
      removed = removed + changed
      missing = missing + n - changed
      local gone_bits = 0
      for _, _ in pairs(owner) do gone_bits = gone_bits + 1 end
      if gone_bits > 0 then redis.call('HINCRBY', N, b, -gone_bits) end
    end
  end
end
return {stored, repeat_, removed, missing, skipped, redis.call('HGET', P .. 'meta', 'epoch')}
"""

# One call for many workers (one round trip per score on one node; one per node on a
# cluster). KEYS[1] = the first worker's P..'meta' (it routes the call), ARGV[1] = N,
# ARGV[2..N+1] = the workers' prefixes P, then pairs (block size, concatenated 8-byte
# keys). Returns one reply per worker: false for
# an unknown worker, else {state, g1, masks1, g2, masks2, ...} where masks is one byte
# per block (the media mask), truncated as WorkerSnapshot documents; groups whose block
# size was not sent are left out. The key blobs are split once for all workers, and
# HMGETs grow geometrically (32, 64, ... 512 fields) so a short full-attention prefix
# stops early. ``allow-cross-slot-keys`` (Redis >= 7): on a cluster the workers of one
# call live on one node but in different slots (one hash tag per worker); Redis still
# wants the *declared* keys in one slot, hence one declared key and the rest built from
# the prefixes. ``no-writes`` lets replicas serve it.
FETCH = r"""#!lua flags=no-writes,allow-cross-slot-keys
local N = tonumber(ARGV[1])
local fields = {}
for a = N + 2, #ARGV, 2 do
  local blob = ARGV[a + 1]
  local t = {}
  for j = 0, #blob / 8 - 1 do t[j + 1] = string.sub(blob, j * 8 + 1, j * 8 + 8) end
  fields[ARGV[a]] = t
end
local char = string.char
local replies = {}
for w = 1, N do
  local P = ARGV[w + 1]
  local meta = P .. 'meta'
  local state = redis.call('HGET', meta, 'state')
  if not state then
    replies[w] = false
  else
    local plan = redis.call('HGET', meta, 'plan') or ''
    local out = {state}
    local bound = -1
    for g, bs, full in string.gmatch(plan, '(-?%d+),(%d+),(%d)') do
      local fs = fields[bs]
      if fs then
        local size = tonumber(bs)
        local n = #fs
        if full == '0' and bound >= 0 then n = math.min(n, math.floor(bound / size)) end
        local G = P .. 'g:' .. g
        local parts = {}
        local last = 0
        local start = 0
        local chunk = 32
        local stop = false
        while start < n and not stop do
          local cnt = math.min(chunk, n - start)
          local vals = redis.call('HMGET', G, unpack(fs, start + 1, start + cnt))
          for j = 1, cnt do
            local m = vals[j]
            if m then
              parts[#parts + 1] = char(tonumber(m))
              last = #parts
            elseif full == '1' then
              stop = true
              break
            else
              parts[#parts + 1] = '\0'
            end
          end
          start = start + cnt
          if chunk < 512 then chunk = chunk * 2 end
        end
        local masks = table.concat(parts, '', 1, last)
        if full == '1' then
          local reach = #masks * size
          if bound < 0 or reach < bound then bound = reach end
        end
        out[#out + 1] = g
        out[#out + 1] = masks
      end
    end
    replies[w] = out
  end
end
return replies
"""
