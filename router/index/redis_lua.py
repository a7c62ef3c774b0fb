"""Server-side Lua for the Redis index: one script call per batch and per (worker, score).

Every key a script touches belongs to one worker and carries its hash tag
(``kvroute:{w:<id>}:...``), so a script runs on one Redis Cluster slot. Scripts build
their key names from the worker prefix (same slot, same node).

Layout of one worker ``P = kvroute:{w:<id>}:``:
``P..'meta'`` hash {state: msgpack metadata, plan: "g,bs,full;..."} ·
``P..'g:'..g`` hash key(8 bytes) -> media mask · ``P..'n:'..g`` hash bit -> block count ·
``P..'e:'..bs`` hash engine hash -> key · ``P..'keys'`` set of the data key names above
(the reverse structure: clearing or deleting a worker unlinks exactly these).
"""

from __future__ import annotations

# KEYS[1] = P..'keys'. ARGV[1] = P. Then a flat op list:
#   1 (store):  group, bs, bit, nsib, sib groups..., n, hash1, key1, ..., hashn, keyn
#   2 (remove): group, bs, bit, nsib, sib groups..., n, hash1, ..., hashn
#   3 (clear)
# Returns {stored, stored_repeat, removed, removed_missing}.
APPLY = r"""
local P = ARGV[1]
local REV = KEYS[1]
local stored, repeat_, removed, missing = 0, 0, 0, 0
local i = 2
local nargs = #ARGV
while i <= nargs do
  local op = ARGV[i]
  if op == '3' then
    local names = redis.call('SMEMBERS', REV)
    for _, name in ipairs(names) do redis.call('UNLINK', name) end
    redis.call('DEL', REV)
    i = i + 1
  else
    local g, bs, b = ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])
    local nsib = tonumber(ARGV[i + 4])
    local sibs = {}
    for s = 1, nsib do sibs[s] = P .. 'g:' .. ARGV[i + 4 + s] end
    i = i + 5 + nsib
    local n = tonumber(ARGV[i])
    i = i + 1
    local G, N, E = P .. 'g:' .. g, P .. 'n:' .. g, P .. 'e:' .. bs
    local changed = 0
    if op == '1' then
      redis.call('SADD', REV, G, N, E)
      for j = 0, n - 1 do
        local h, k = ARGV[i + 2 * j], ARGV[i + 2 * j + 1]
        if redis.call('HSETNX', E, h, k) == 0 then k = redis.call('HGET', E, h) end
        local m = tonumber(redis.call('HGET', G, k) or '0')
        if bit.band(m, b) == 0 then
          redis.call('HSET', G, k, m + b)
          changed = changed + 1
        end
      end
      i = i + 2 * n
      stored = stored + changed
      repeat_ = repeat_ + n - changed
      if changed > 0 then redis.call('HINCRBY', N, b, changed) end
    else
      for j = 0, n - 1 do
        local h = ARGV[i + j]
        local k = redis.call('HGET', E, h)
        local m = 0
        if k then m = tonumber(redis.call('HGET', G, k) or '0') end
        if bit.band(m, b) ~= 0 then
          changed = changed + 1
          m = m - b
          if m > 0 then
            redis.call('HSET', G, k, m)
          else
            redis.call('HDEL', G, k)
            local held = false
            for _, S in ipairs(sibs) do
              if redis.call('HEXISTS', S, k) == 1 then held = true break end
            end
            if not held then redis.call('HDEL', E, h) end
          end
        end
      end
      i = i + n
      removed = removed + changed
      missing = missing + n - changed
      if changed > 0 then redis.call('HINCRBY', N, b, -changed) end
    end
  end
end
return {stored, repeat_, removed, missing}
"""

# KEYS[1] = P..'meta'. ARGV[1] = P, then pairs (block size, concatenated 8-byte keys).
# Returns false for an unknown worker, else {state, g1, masks1, g2, masks2, ...} where
# masks is one byte per block (the media mask), truncated as WorkerSnapshot documents;
# groups whose block size was not sent are left out.
FETCH = r"""
local meta = KEYS[1]
local P = ARGV[1]
local state = redis.call('HGET', meta, 'state')
if not state then return false end
local plan = redis.call('HGET', meta, 'plan') or ''
local blobs = {}
for a = 2, #ARGV, 2 do blobs[ARGV[a]] = ARGV[a + 1] end
local out = {state}
local bound = -1
local CH = 128
for g, bs, full in string.gmatch(plan, '(%d+),(%d+),(%d)') do
  local blob = blobs[bs]
  if blob then
    local size = tonumber(bs)
    local n = #blob / 8
    if full == '0' and bound >= 0 then n = math.min(n, math.floor(bound / size)) end
    local G = P .. 'g:' .. g
    local parts = {}
    local last = 0
    local start = 0
    local stop = false
    while start < n and not stop do
      local cnt = math.min(CH, n - start)
      local fields = {}
      for j = 1, cnt do
        local o = (start + j - 1) * 8
        fields[j] = string.sub(blob, o + 1, o + 8)
      end
      local vals = redis.call('HMGET', G, unpack(fields))
      for j = 1, cnt do
        local m = vals[j]
        if m then
          parts[#parts + 1] = string.char(tonumber(m))
          last = #parts
        elseif full == '1' then
          stop = true
          break
        else
          parts[#parts + 1] = '\0'
        end
      end
      start = start + cnt
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
return out
"""
