-- bloomctl's module-free Bloom filter: one Redis string per filter, hashed on the server.
-- Layout (big-endian): magic "bloomctl" | u8 format | u8 hash scheme | u16 0 | u32 k | u64 m (bits)
-- | u64 capacity | f64 error rate | i64 items added | 16 zero bytes | m bits (bit i at string bit 512 + i).
-- Positions of an item: hex = SHA1(item); h1 = first 12 hex digits, h2 = next 12 (48-bit integers);
-- p0 = h1 mod m, step = h2 mod m (1 if that is 0), p(i+1) = (p(i) + step) mod m, for i < k.

do
local FORMAT = 1
local SCHEME = 1
local MAGIC = 'bloomctl'
local HEADER_BYTES = 64
local HEADER_BITS = 512
local ITEMS_OFFSET = 320
local MAX_ARGS = 400 -- BITFIELD arguments per call (measured best; unpack() must stay under 8000)

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

-- A function that writes the k positions of an item into `out` (built per call: the library's
-- loading context has no redis.sha1hex, and locals are faster than global lookups per item).
local function positions_for(h)
  local sha1hex, fmod, sub, tonumber = redis.sha1hex, math.fmod, string.sub, tonumber
  local m, k = h.m, h.k
  return function(item, out)
    local hex = sha1hex(item)
    local pos = fmod(tonumber(sub(hex, 1, 12), 16), m)
    local step = fmod(tonumber(sub(hex, 13, 24), 16), m)
    if step == 0 then
      step = 1
    end
    for i = 1, k do
      out[i] = pos
      pos = fmod(pos + step, m)
    end
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

-- Sets the bits of every item with BITFIELD SET u1 (which answers each bit's old value), a few
-- items per call: the Lua-to-Redis argument conversion, not the hashing, is what costs here.
local function madd(keys, args)
  local key = keys[1]
  local h, e = header(key)
  if not h then
    return redis.error_reply(e)
  end
  local k, positions, unpack = h.k, positions_for(h), unpack
  local result, added = {}, 0
  local ops, n, first = {}, 0, 1
  local pos = {}
  local function flush(last)
    local old = redis.call('BITFIELD', key, unpack(ops, 1, n))
    local j = 1
    for item = first, last do
      local fresh = 0
      for _ = 1, k do
        if old[j] == 0 then
          fresh = 1
        end
        j = j + 1
      end
      result[item] = fresh
      added = added + fresh
    end
    n, first = 0, last + 1
  end
  for i = 1, #args do
    positions(args[i], pos)
    for j = 1, k do
      ops[n + 1], ops[n + 2], ops[n + 3], ops[n + 4] = 'SET', 'u1', HEADER_BITS + pos[j], 1
      n = n + 4
    end
    if n >= MAX_ARGS then
      flush(i)
    end
  end
  if n > 0 then
    flush(#args)
  end
  if added > 0 then
    redis.call('BITFIELD', key, 'INCRBY', 'i64', ITEMS_OFFSET, added)
  end
  return result
end

local function mexists(keys, args)
  local h, e = header(keys[1])
  if not h then
    return redis.error_reply(e)
  end
  local result = {}
  local pos, positions = {}, positions_for(h)
  for i = 1, #args do
    positions(args[i], pos)
    local found = 1
    for j = 1, h.k do
      if redis.call('GETBIT', keys[1], HEADER_BITS + pos[j]) == 0 then
        found = 0
        break
      end
    end
    result[i] = found
  end
  return result
end

-- The single-item forms answer the first flag, or pass the error on (indexing it would answer nil).
local function first(reply)
  if reply.err then
    return reply
  end
  return reply[1]
end

local function add(keys, args)
  return first(madd(keys, {args[1]}))
end

local function exists(keys, args)
  return first(mexists(keys, {args[1]}))
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

HANDLERS.reserve = {reserve, false}
HANDLERS.add = {add, false}
HANDLERS.madd = {madd, false}
HANDLERS.exists = {exists, true}
HANDLERS.mexists = {mexists, true}
HANDLERS.info = {info, true}
HANDLERS.card = {card, true}
HANDLERS.bitcount = {bitcount, true}
HANDLERS.version = {version, true}
end
