"""Server-side Lua of the Redis index's read side: one script call per score and node.

Split from ``router.index.redis_read`` (which builds the arguments and unpacks the
answer); the layout it reads is described in ``router.index.redis_lua``.
"""

from __future__ import annotations

# One call reads K shards (all of a single server's one shard; on a cluster, the shards
# one node serves: their slots differ, hence ``allow-cross-slot-keys``, Redis >= 7).
# KEYS[1] = the first shard's X..'state' (routes the call). ARGV[1] = K, then per shard
# X (its prefix), the metadata version the client holds its workers' metadata at ("-":
# none), the worker ids (one msgpack array), the tables to read as the client derived
# them from that metadata ("bounded;g,bs,all_full,any_full;..."); then pairs (block
# size, concatenated 6-byte row fields: ``redis_codec.ROW_KEY_BYTES``). When the version
# is current the ids and plans are not read; otherwise the tables are derived from the
# workers' plans.
# Returns per shard {version, states, slots, ntables, then per table g, bs, n, rows}:
# the workers' metadata and slots (false when unknown) -- or false twice when the
# client's version is current (``X..'ver'`` grows with every metadata or slot change)
# -- then per (group, block size) some requested worker has, the number of blocks read
# and their holders strings joined by NUL (no holders byte is 0; a block nobody holds is
# empty; a block held exactly like the one before is the single byte 1 -- no holders
# string has length 1 -- so a prefix every worker holds costs one string, not one per
# block). A table only full-attention workers read stops before the first block no
# worker holds; the other tables stop at the longest full-attention prefix any table
# allows (when every worker has one): no worker's hit can reach past it. HMGETs grow
# geometrically (32 ... 512 fields) so a short prefix stops early. ``no-writes`` lets
# replicas serve it.
FETCH = r"""#!lua flags=no-writes,allow-cross-slot-keys
local K = tonumber(ARGV[1])
local fields = {}
for a = 2 + 4 * K, #ARGV, 2 do
  local blob = ARGV[a + 1]
  local t = {}
  for j = 0, #blob / 6 - 1 do t[j + 1] = string.sub(blob, j * 6 + 1, j * 6 + 6) end
  fields[ARGV[a]] = t
end
local out = {}
local function read(X, g, bs, stop_at_miss, n)
  local fs = fields[bs]
  local XG = X .. 'x:' .. g
  local parts = {}
  local start, chunk, miss, nread = 0, 32, -1, 0
  local prev = nil
  while start < n do
    local cnt = math.min(chunk, n - start)
    local vals = redis.call('HMGET', XG, unpack(fs, start + 1, start + cnt))
    local take = cnt
    for j = 1, cnt do
      local v = vals[j]
      if not v then
        if miss < 0 then miss = start + j - 1 end
        if stop_at_miss then
          take = j - 1
          break
        end
        v = ''
      end
      -- Lua strings are interned: equality is a pointer test, and a repeated row
      -- (a shared prefix: every holder holds both blocks alike) goes as one byte.
      if v == prev then vals[j] = '\1' else vals[j] = v; prev = v end
    end
    if take > 0 then parts[#parts + 1] = table.concat(vals, '\0', 1, take) end
    nread = nread + take
    if take < cnt then break end
    start = start + cnt
    if chunk < 512 then chunk = chunk * 2 end
  end
  out[#out + 1] = g
  out[#out + 1] = bs
  out[#out + 1] = nread
  out[#out + 1] = table.concat(parts, '\0')
  if miss < 0 then miss = nread end
  return miss
end
for k = 0, K - 1 do
  local X, version = ARGV[2 + 4 * k], ARGV[3 + 4 * k]
  local packed, spec = ARGV[4 + 4 * k], ARGV[5 + 4 * k]
  local ver = redis.call('GET', X .. 'ver') or '0'
  local tabs, order = {}, {}
  local bounded = true
  local states, slots = false, false
  if ver == version then
    bounded = string.sub(spec, 1, 1) == '1'
    for g, bs, all, any in string.gmatch(spec, '(-?%d+),(%d+),(%d),(%d)') do
      local t = g .. ',' .. bs
      order[#order + 1] = {g, bs, t}
      tabs[t] = {all == '1', any == '1'}
    end
  else
    local ids = cmsgpack.unpack(packed)
    local N = #ids
    if N > 0 then
      states = redis.call('HMGET', X .. 'state', unpack(ids))
      slots = redis.call('HMGET', X .. 'slot', unpack(ids))
      local plans = redis.call('HMGET', X .. 'plan', unpack(ids))
      for w = 1, N do
        local plan = plans[w]
        if plan then
          local has_full = false
          for g, bs, full in string.gmatch(plan, '(-?%d+),(%d+),(%d)') do
            if fields[bs] then
              local t = g .. ',' .. bs
              local f = full == '1'
              if tabs[t] == nil then
                order[#order + 1] = {g, bs, t}
                tabs[t] = {f, f}
              else
                tabs[t] = {tabs[t][1] and f, tabs[t][2] or f}
              end
              if f then has_full = true end
            end
          end
          if not has_full then bounded = false end
        end
      end
    else
      states, slots = {}, {}
    end
  end
  out[#out + 1] = ver
  out[#out + 1] = states
  out[#out + 1] = slots
  out[#out + 1] = #order
  local bound = -1
  -- Tables some worker reads as full attention first: they bound the others.
  for _, e in ipairs(order) do
    local t = tabs[e[3]]
    if t[2] then
      local reach = read(X, e[1], e[2], t[1], #fields[e[2]]) * tonumber(e[2])
      if reach > bound then bound = reach end
    end
  end
  for _, e in ipairs(order) do
    if not tabs[e[3]][2] then
      local n = #fields[e[2]]
      if bounded and bound >= 0 then n = math.min(n, math.floor(bound / tonumber(e[2]))) end
      read(X, e[1], e[2], false, n)
    end
  end
end
return out
"""
