-- bloomctl's module-free cuckoo filter: one Redis string per filter, fingerprints in buckets.
-- Layout (big-endian): magic "bloomcuk" | u8 format 1 | u8 hash scheme 1 | u8 fingerprint bytes (1, 2
-- or 4) | u8 0 | u16 bucket size | u16 max iterations | u64 buckets (a power of two) | u64 capacity
-- asked for | i64 items | i64 items deleted | f64 error rate | 8 zero bytes | then buckets x bucket
-- size slots of (fingerprint bytes) each, 0 meaning empty: bucket i starts at byte 64 + i x bucket
-- size x fingerprint bytes, a slot's fingerprint is big-endian.
-- An item: hex = SHA1(item); h = its first 12 hex digits (48 bits); i1 = h mod buckets;
-- fp = (hex digits 13..20 as a 32-bit number) mod (2^(8 x fingerprint bytes) - 1) + 1;
-- i2 = i1 XOR (((fp x 0x5bd1e995) mod 2^32) mod buckets), and i1 = i2 XOR the same: either bucket
-- names the other. An item is present when either bucket holds its fingerprint.
-- Insert: a free slot of i1, else of i2, else relocation: a fingerprint of the current bucket (the
-- slot chosen by a Park-Miller generator seeded with h) trades places with the one being placed,
-- which moves to its other bucket, at most `max iterations` times. The walk is kept in memory and
-- written only when it ends in a free slot: a failed insert changes nothing.

do
local CF_MAGIC = 'bloomcuk'
local CF_FORMAT = 1
local CF_SCHEME = 1
local CF_HEADER = 64
local CF_PACK = '>c8BBBBHHI8I8i8i8d'
local ITEMS_BIT = 256 -- the items counter is the header's byte 32 (BITFIELD INCRBY i64)
local DELETES_BIT = 320
local MAX_BUCKETS = 1073741824 -- bucket numbers are XORed as 32-bit integers
local MAX_BYTES = 536870912

local function cf_header(key)
  local raw = redis.call('GETRANGE', key, 0, CF_HEADER - 1)
  if #raw == 0 then
    return nil, 'ERR not found'
  end
  if #raw < CF_HEADER or string.sub(raw, 1, 8) ~= CF_MAGIC then
    return nil, 'WRONGTYPE key holds a value that is not a bloomctl cuckoo filter'
  end
  local _, format, scheme, fpb, _, bs, mi, nb, capacity, items, deletes, err = struct.unpack(CF_PACK, raw)
  if format ~= CF_FORMAT or scheme ~= CF_SCHEME then
    return nil, 'ERR bloomctl cuckoo filter format ' .. format .. ' is not supported by library version ' .. LIB_VERSION
  end
  return {
    key = key, fpb = fpb, bs = bs, mi = mi, nb = nb, capacity = capacity, items = items,
    deletes = deletes, err = err, width = bs * fpb, fpmax = 2 ^ (8 * fpb) - 1,
  }
end

-- (fp x 0x5bd1e995) mod 2^32, exactly: Lua numbers are doubles, so the product is taken in halves.
local function mulhash(fp)
  local lo = fp % 65536
  local hi = (fp - lo) / 65536
  return (lo * 0x5bd1e995 + ((hi * 0x5bd1e995) % 65536) * 65536) % 4294967296
end

local function alt(i, fp, nb)
  return bit.bxor(i, mulhash(fp) % nb)
end

local function decode(raw, fpb, bs)
  local slots, byte = {}, string.byte
  if fpb == 1 then
    for j = 1, bs do
      slots[j] = byte(raw, j)
    end
  elseif fpb == 2 then
    for j = 1, bs do
      local a, b = byte(raw, 2 * j - 1, 2 * j)
      slots[j] = a * 256 + b
    end
  else
    for j = 1, bs do
      local a, b, c, d = byte(raw, 4 * j - 3, 4 * j)
      slots[j] = ((a * 256 + b) * 256 + c) * 256 + d
    end
  end
  return slots
end

local function encode(fp, fpb)
  if fpb == 1 then
    return string.char(fp)
  elseif fpb == 2 then
    return string.char((fp - fp % 256) / 256, fp % 256)
  end
  return struct.pack('>I4', fp)
end

local function read_bucket(h, i)
  local at = CF_HEADER + i * h.width
  return decode(redis.call('GETRANGE', h.key, at, at + h.width - 1), h.fpb, h.bs)
end

local function write_bucket(h, i, slots)
  local parts = {}
  for j = 1, h.bs do
    parts[j] = encode(slots[j], h.fpb)
  end
  redis.call('SETRANGE', h.key, CF_HEADER + i * h.width, table.concat(parts))
end

local function put(h, i, j, fp)
  redis.call('SETRANGE', h.key, CF_HEADER + i * h.width + (j - 1) * h.fpb, encode(fp, h.fpb))
end

local function locate(h, item)
  local hex = redis.sha1hex(item)
  local hv = tonumber(string.sub(hex, 1, 12), 16)
  local fp = tonumber(string.sub(hex, 13, 20), 16) % h.fpmax + 1
  local i1 = hv % h.nb
  return fp, i1, alt(i1, fp, h.nb), hv
end

local function free_slot(slots)
  for j = 1, #slots do
    if slots[j] == 0 then
      return j
    end
  end
  return nil
end

local function find(slots, fp)
  for j = 1, #slots do
    if slots[j] == fp then
      return j
    end
  end
  return nil
end

local function matches(slots, fp)
  local n = 0
  for j = 1, #slots do
    if slots[j] == fp then
      n = n + 1
    end
  end
  return n
end

local function relocate(h, fp, i1, i2, b1, b2, seed)
  local cache = {[i1] = b1, [i2] = b2}
  local dirty = {}
  local state = seed % 2147483646 + 1
  local i = (state % 2 == 0) and i1 or i2
  local cur = fp
  for _ = 1, h.mi do
    state = (state * 16807) % 2147483647
    local slots = cache[i]
    local v = state % h.bs + 1
    cur, slots[v] = slots[v], cur
    dirty[i] = true
    i = alt(i, cur, h.nb)
    local nxt = cache[i]
    if not nxt then
      nxt = read_bucket(h, i)
      cache[i] = nxt
    end
    local j = free_slot(nxt)
    if j then
      nxt[j] = cur
      dirty[i] = true
      for index, _ in pairs(dirty) do
        write_bucket(h, index, cache[index])
      end
      return 1
    end
  end
  return -1
end

local function insert(h, fp, i1, i2, seed)
  local b1 = read_bucket(h, i1)
  local j = free_slot(b1)
  if j then
    put(h, i1, j, fp)
    return 1
  end
  local b2 = b1
  if i2 ~= i1 then
    b2 = read_bucket(h, i2)
  end
  j = free_slot(b2)
  if j then
    put(h, i2, j, fp)
    return 1
  end
  return relocate(h, fp, i1, i2, b1, b2, seed)
end

local function contains(h, fp, i1, i2)
  if find(read_bucket(h, i1), fp) then
    return true
  end
  return i2 ~= i1 and find(read_bucket(h, i2), fp) ~= nil
end

local function is_power_of_two(n)
  if n < 1 or n ~= math.floor(n) then
    return false
  end
  while n > 1 do
    if n % 2 ~= 0 then
      return false
    end
    n = n / 2
  end
  return true
end

-- ARGV: buckets, bucket size, fingerprint bytes, max iterations, capacity, error rate
local function cf_reserve(keys, args)
  local nb, bs, fpb, mi = tonumber(args[1]), tonumber(args[2]), tonumber(args[3]), tonumber(args[4])
  local capacity, err = tonumber(args[5]), tonumber(args[6])
  if not (nb and bs and fpb and mi and capacity and err) or not is_power_of_two(nb) or nb > MAX_BUCKETS
    or bs < 1 or bs > 255 or bs ~= math.floor(bs) or (fpb ~= 1 and fpb ~= 2 and fpb ~= 4)
    or mi < 1 or mi > 65535 or mi ~= math.floor(mi) or capacity < 1 or not (err > 0 and err < 1) then
    return redis.error_reply('ERR bad arguments: buckets (a power of two), bucket size 1-255, fingerprint bytes 1, 2 or 4, max iterations 1-65535, capacity, error rate')
  end
  local size = CF_HEADER + nb * bs * fpb
  if size > MAX_BYTES then
    return redis.error_reply('ERR a cuckoo filter of ' .. size .. ' bytes exceeds the 512 MB string limit')
  end
  if redis.call('EXISTS', keys[1]) == 1 then
    return redis.error_reply('ERR item exists')
  end
  local head = struct.pack(CF_PACK, CF_MAGIC, CF_FORMAT, CF_SCHEME, fpb, 0, bs, mi, nb, capacity, 0, 0, err)
  redis.call('SET', keys[1], head .. string.rep('\0', CF_HEADER - #head))
  redis.call('SETRANGE', keys[1], size - 1, '\0')
  return 'OK'
end

local function counted(h, field_bit, n)
  if n ~= 0 then
    redis.call('BITFIELD', h.key, 'INCRBY', 'i64', field_bit, n)
  end
end

-- Every item inserted once more (a copy each: a cuckoo filter counts): 1, or -1 where no slot was found.
local function cf_madd(keys, args)
  local h, e = cf_header(keys[1])
  if not h then
    return redis.error_reply(e)
  end
  local out, added = {}, 0
  for n = 1, #args do
    local fp, i1, i2, seed = locate(h, args[n])
    out[n] = insert(h, fp, i1, i2, seed)
    if out[n] == 1 then
      added = added + 1
    end
  end
  counted(h, ITEMS_BIT, added)
  return out
end

-- Only items not present yet: 1 inserted, 0 present (or a false positive), -1 no slot found.
local function cf_maddnx(keys, args)
  local h, e = cf_header(keys[1])
  if not h then
    return redis.error_reply(e)
  end
  local out, added = {}, 0
  for n = 1, #args do
    local fp, i1, i2, seed = locate(h, args[n])
    if contains(h, fp, i1, i2) then
      out[n] = 0
    else
      out[n] = insert(h, fp, i1, i2, seed)
      if out[n] == 1 then
        added = added + 1
      end
    end
  end
  counted(h, ITEMS_BIT, added)
  return out
end

local function cf_mexists(keys, args)
  local h, e = cf_header(keys[1])
  if not h then
    return redis.error_reply(e)
  end
  local out = {}
  for n = 1, #args do
    local fp, i1, i2 = locate(h, args[n])
    out[n] = contains(h, fp, i1, i2) and 1 or 0
  end
  return out
end

local function cf_count(keys, args)
  local h, e = cf_header(keys[1])
  if not h then
    return redis.error_reply(e)
  end
  local fp, i1, i2 = locate(h, args[1])
  local n = matches(read_bucket(h, i1), fp)
  if i2 ~= i1 then
    n = n + matches(read_bucket(h, i2), fp)
  end
  return n
end

-- Removes one copy of each item's fingerprint (i1's bucket first): 1, or 0 when none was there.
-- Deleting an item that was never added may remove another item's fingerprint: a false negative.
local function cf_mdel(keys, args)
  local h, e = cf_header(keys[1])
  if not h then
    return redis.error_reply(e)
  end
  local out, removed = {}, 0
  for n = 1, #args do
    local fp, i1, i2 = locate(h, args[n])
    out[n] = 0
    for _, i in ipairs(i2 ~= i1 and {i1, i2} or {i1}) do
      local j = find(read_bucket(h, i), fp)
      if j then
        put(h, i, j, 0)
        out[n] = 1
        removed = removed + 1
        break
      end
    end
  end
  counted(h, ITEMS_BIT, -removed)
  counted(h, DELETES_BIT, removed)
  return out
end

local function first_of(reply)
  if reply.err then
    return reply
  end
  return reply[1]
end

local function cf_info(keys, args)
  local h, e = cf_header(keys[1])
  if not h then
    return redis.error_reply(e)
  end
  return {
    'Size', redis.call('STRLEN', keys[1]),
    'Number of buckets', h.nb,
    'Number of filters', 1,
    'Number of items inserted', h.items,
    'Number of items deleted', h.deletes,
    'Bucket size', h.bs,
    'Expansion rate', 0,
    'Max iterations', h.mi,
    'Fingerprint bits', h.fpb * 8,
    'Capacity', h.capacity,
    'Error rate', string.format('%.17g', h.err),
    'Format', CF_FORMAT,
  }
end

HANDLERS.cf_reserve = {cf_reserve, false}
HANDLERS.cf_add = {function(keys, args) return first_of(cf_madd(keys, {args[1]})) end, false}
HANDLERS.cf_addnx = {function(keys, args) return first_of(cf_maddnx(keys, {args[1]})) end, false}
HANDLERS.cf_madd = {cf_madd, false}
HANDLERS.cf_maddnx = {cf_maddnx, false}
HANDLERS.cf_exists = {function(keys, args) return first_of(cf_mexists(keys, {args[1]})) end, true}
HANDLERS.cf_mexists = {cf_mexists, true}
HANDLERS.cf_count = {cf_count, true}
HANDLERS.cf_del = {function(keys, args) return first_of(cf_mdel(keys, {args[1]})) end, false}
HANDLERS.cf_mdel = {cf_mdel, false}
HANDLERS.cf_info = {cf_info, true}
end
