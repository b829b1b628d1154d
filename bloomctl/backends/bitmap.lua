#!lua name=bloomctl
-- bloomctl's module-free Bloom filter: one Redis string per filter, hashed on the server.
-- Layout (big-endian): magic "bloomctl" | u8 format | u8 hash scheme | u16 0 | u32 k | u64 m (bits)
-- | u64 capacity | f64 error rate | i64 items added | 16 zero bytes | m bits (bit i at string bit 512 + i).
-- Positions of an item: hex = SHA1(item); h1 = first 12 hex digits, h2 = next 12 (48-bit integers);
-- p0 = h1 mod m, step = h2 mod m (1 if that is 0), p(i+1) = (p(i) + step) mod m, for i < k.

local LIB_VERSION = 1
local FORMAT = 1
local SCHEME = 1
local MAGIC = 'bloomctl'
local HEADER_BYTES = 64
local HEADER_BITS = 512
local ITEMS_OFFSET = 320
local MAX_OPS = 1000 -- BITFIELD operations per call: keeps unpack() under Lua's C stack limit

local function header(key)
  local raw = redis.call('GETRANGE', key, 0, HEADER_BYTES - 1)
  if #raw == 0 then
    return nil, 'ERR not found'
  end
  if #raw < HEADER_BYTES or string.sub(raw, 1, 8) ~= MAGIC then
    return nil, 'WRONGTYPE key holds a string that is not a bloomctl bitmap filter'
  end
  local _, format, scheme, _, k, m, capacity, err, items = struct.unpack('>c8BBHI4I8I8di8', raw)
  if format ~= FORMAT or scheme ~= SCHEME then
    return nil, 'ERR bloomctl filter format ' .. format .. ' is not supported by library version ' .. LIB_VERSION
  end
  return {k = k, m = m, capacity = capacity, error_rate = err, items = items}
end

local function positions(item, h, out)
  local hex = redis.sha1hex(item)
  local m = h.m
  local pos = math.fmod(tonumber(string.sub(hex, 1, 12), 16), m)
  local step = math.fmod(tonumber(string.sub(hex, 13, 24), 16), m)
  if step == 0 then
    step = 1
  end
  for _ = 1, h.k do
    out[#out + 1] = pos
    pos = math.fmod(pos + step, m)
  end
end

local function reserve(keys, args)
  local m, k, capacity = tonumber(args[1]), tonumber(args[2]), tonumber(args[3])
  local err = tonumber(args[4])
  if not (m and k and capacity and err) or m < 64 or m % 64 ~= 0 or k < 1 or capacity < 1 or err <= 0 or err >= 1 then
    return redis.error_reply('ERR bad arguments: bits (a multiple of 64), hashes, capacity, error rate')
  end
  if m + HEADER_BITS > 4294967296 then
    return redis.error_reply('ERR a filter of ' .. m .. ' bits exceeds the 512 MB string limit')
  end
  if redis.call('EXISTS', keys[1]) == 1 then
    return redis.error_reply('ERR item exists')
  end
  local head = struct.pack('>c8BBHI4I8I8di8', MAGIC, FORMAT, SCHEME, 0, k, m, capacity, err, 0)
  redis.call('SET', keys[1], head .. string.rep('\0', HEADER_BYTES - #head))
  redis.call('SETRANGE', keys[1], HEADER_BYTES + m / 8 - 1, '\0')
  return 'OK'
end

local function madd(keys, args)
  local h, e = header(keys[1])
  if not h then
    return redis.error_reply(e)
  end
  local result = {}
  local pos = {}
  for i = 1, #args do
    positions(args[i], h, pos)
  end
  local k = h.k
  local added = 0
  local item = 1
  local seen = 0
  local fresh = false
  local ops = {}
  local function flush()
    if #ops == 0 then
      return
    end
    local old = redis.call('BITFIELD', keys[1], unpack(ops))
    for j = 1, #old do
      if old[j] == 0 then
        fresh = true
      end
      seen = seen + 1
      if seen == k then
        result[item] = fresh and 1 or 0
        if fresh then
          added = added + 1
        end
        item, seen, fresh = item + 1, 0, false
      end
    end
    ops = {}
  end
  for i = 1, #pos do
    ops[#ops + 1] = 'SET'
    ops[#ops + 1] = 'u1'
    ops[#ops + 1] = HEADER_BITS + pos[i]
    ops[#ops + 1] = 1
    if #ops >= MAX_OPS * 4 then
      flush()
    end
  end
  flush()
  if added > 0 then
    redis.call('BITFIELD', keys[1], 'INCRBY', 'i64', ITEMS_OFFSET, added)
  end
  return result
end

local function mexists(keys, args)
  local h, e = header(keys[1])
  if not h then
    return redis.error_reply(e)
  end
  local result = {}
  for i = 1, #args do
    local pos = {}
    positions(args[i], h, pos)
    local found = 1
    for j = 1, #pos do
      if redis.call('GETBIT', keys[1], HEADER_BITS + pos[j]) == 0 then
        found = 0
        break
      end
    end
    result[i] = found
  end
  return result
end

local function add(keys, args)
  return madd(keys, {args[1]})[1]
end

local function exists(keys, args)
  return mexists(keys, {args[1]})[1]
end

local function info(keys, args)
  local h, e = header(keys[1])
  if not h then
    return redis.error_reply(e)
  end
  return {
    'Capacity', h.capacity,
    'Size', redis.call('STRLEN', keys[1]),
    'Number of filters', 1,
    'Number of items inserted', h.items,
    'Expansion rate', false,
    'Error rate', string.format('%.17g', h.error_rate),
    'Hashes', h.k,
    'Bits', h.m,
    'Format', FORMAT,
  }
end

local function card(keys, args)
  local h, e = header(keys[1])
  if not h then
    if e == 'ERR not found' then
      return 0
    end
    return redis.error_reply(e)
  end
  return h.items
end

local function bitcount(keys, args)
  local h, e = header(keys[1])
  if not h then
    return redis.error_reply(e)
  end
  return redis.call('BITCOUNT', keys[1], HEADER_BYTES, -1)
end

local function version(keys, args)
  return LIB_VERSION
end

local HANDLERS = {
  reserve = {reserve, false},
  add = {add, false},
  madd = {madd, false},
  exists = {exists, true},
  mexists = {mexists, true},
  info = {info, true},
  card = {card, true},
  bitcount = {bitcount, true},
  version = {version, true},
}
