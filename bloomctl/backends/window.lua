-- Time-windowed filters (docs/windows.md): a hash at the window's own key holds its settings; one
-- filter per period ("bucket") holds the items added during it, at PREFIX:LABEL (in the window key's
-- hash slot). The server's clock (TIME) decides the current bucket: period index
-- c = floor((now - offset) / period); its start is offset + c x period; LABEL is that start in UTC,
-- YYYY-MM-DD when the period is whole days, else YYYY-MM-DDTHH.
-- window_add    KEYS: the window; ARGV: items. Adds to the current bucket, never creating it: a
--   missing bucket (no rotation ran) is an error, not a filter made with default parameters.
-- window_exists KEYS: the window; ARGV: items. 1 where any of the last `keep` buckets (the current
--   one and those before it) has the item; missing buckets count as empty.
-- window_bucket KEYS: the window; ARGV: [unix seconds]. The key of the bucket for that moment (the
--   server's clock when not given), and whether it exists.

do
local function civil(days)
  -- days since 1970-01-01 to year, month, day (H. Hinnant's algorithm; Lua has no os.date here)
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400 + (m <= 2 and 1 or 0)
  return y, m, d
end

local function label(start, period)
  local days = math.floor(start / 86400)
  local y, m, d = civil(days)
  if period % 86400 == 0 then
    return string.format('%04d-%02d-%02d', y, m, d)
  end
  return string.format('%04d-%02d-%02dT%02d', y, m, d, math.floor((start - days * 86400) / 3600))
end

local function settings(key, at)
  local kind = redis.call('TYPE', key)
  kind = type(kind) == 'table' and kind.ok or kind
  if kind == 'none' then
    return nil, 'ERR not found'
  elseif kind ~= 'hash' then
    return nil, 'WRONGTYPE the key does not hold a bloomctl window'
  end
  local raw = redis.call('HMGET', key, 'bloomctl_window', 'period', 'offset', 'keep', 'prefix', 'backend')
  if not raw[1] then
    return nil, 'WRONGTYPE the key does not hold a bloomctl window'
  end
  local w = {period = tonumber(raw[2]), offset = tonumber(raw[3]), keep = tonumber(raw[4]), prefix = raw[5], backend = raw[6]}
  if not (w.period and w.offset and w.keep and w.prefix and w.backend) then
    return nil, 'ERR the window settings are incomplete'
  end
  -- (window.py's ranges: a damaged hash must not divide by zero or look up without end)
  if w.period < 3600 or w.period % 3600 ~= 0 or w.period > 366 * 86400 or w.keep < 1 or w.keep > 1000 or w.keep % 1 ~= 0 then
    return nil, 'ERR the window settings are damaged'
  end
  local now = tonumber(at) or tonumber(redis.call('TIME')[1])
  w.current = math.floor((now - w.offset) / w.period)
  return w
end

local function bucket(w, index)
  return w.prefix .. ':' .. label(w.offset + index * w.period, w.period)
end

-- An error of a bucket's own (another kind of value at its name, a full filter) names the bucket.
local function bucket_error(key, reply)
  local text = type(reply) == 'table' and reply.err or tostring(reply)
  return redis.error_reply('ERR bloomctl window bucket ' .. key .. ': ' .. tostring(text))
end

local KINDS = {['redisbloom'] = 'MBbloom--', ['redisbloom-cuckoo'] = 'MBbloomCF', ['bitmap'] = 'string', ['lua-cuckoo'] = 'string'}

local function lookup(w, key, items)
  if w.backend == 'redisbloom' then
    return redis.pcall('BF.MEXISTS', key, unpack(items))
  elseif w.backend == 'redisbloom-cuckoo' then
    return redis.pcall('CF.MEXISTS', key, unpack(items))
  elseif w.backend == 'bitmap' then
    return HANDLERS.mexists[1]({key}, items)
  end
  return HANDLERS.cf_mexists[1]({key}, items)
end

local function window_add(keys, args)
  local w, e = settings(keys[1])
  if not w then
    return redis.error_reply(e)
  end
  local key = bucket(w, w.current)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'none' then
    return redis.error_reply('ERR bloomctl window bucket ' .. key .. ' does not exist: run `bloomctl window rotate` (from cron) to create the coming buckets')
  elseif kind ~= KINDS[w.backend] then
    return bucket_error(key, 'WRONGTYPE it holds a ' .. kind .. ', not the window\'s filter')
  end
  local reply
  if w.backend == 'redisbloom' then
    reply = redis.pcall('BF.INSERT', key, 'NOCREATE', 'ITEMS', unpack(args))
  elseif w.backend == 'redisbloom-cuckoo' then
    reply = redis.pcall('CF.INSERTNX', key, 'NOCREATE', 'ITEMS', unpack(args))
  elseif w.backend == 'bitmap' then
    reply = HANDLERS.madd[1]({key}, args)
  else
    reply = HANDLERS.cf_maddnx[1]({key}, args)
  end
  if reply.err then
    return bucket_error(key, reply)
  end
  return reply
end

local function window_exists(keys, args)
  local w, e = settings(keys[1])
  if not w then
    return redis.error_reply(e)
  end
  local found = {}
  for n = 1, #args do
    found[n] = 0
  end
  for index = w.current - w.keep + 1, w.current do
    local key = bucket(w, index)
    -- a missing bucket, or someone else's value at its name, counts as empty
    if redis.call('TYPE', key)['ok'] == KINDS[w.backend] then
      local flags = lookup(w, key, args)
      if flags.err then
        if string.find(flags.err, 'WRONGTYPE', 1, true) then
          flags = {}
        else
          return bucket_error(key, flags)
        end
      end
      for n = 1, #args do
        if flags[n] == 1 then
          found[n] = 1
        end
      end
    end
  end
  return found
end

local function window_bucket(keys, args)
  local w, e = settings(keys[1], args[1])
  if not w then
    return redis.error_reply(e)
  end
  local key = bucket(w, w.current)
  return {key, redis.call('EXISTS', key)}
end

HANDLERS.window_add = {window_add, false}
HANDLERS.window_bucket = {window_bucket, true}
HANDLERS.window_exists = {window_exists, true}
end
