-- Dual writes to a cuckoo filter while bloomctl rebuilds it (docs/cuckoo.md, "Adds and deletes during
-- a rebuild"), for RedisBloom's CF.* and the module-free cuckoo filter alike.
-- cf_dual  KEYS: active, standby, standby metadata, operation log, the filter's lock; ARGV: 'add' or
--   'del', items...
--   Applies the operation to the active filter and answers its flags (add: 1, or -1 where no slot
--   was found; del: 1, or 0 where the fingerprint was not there). While a rebuild loads the standby
--   (its metadata says dual = log and state = loading, and the rebuild's lock is held), the
--   operation is appended to the log
--   ('+' or '-' then the item) instead: the rebuild replays it once every source item is in, knowing
--   which items the standby holds, so that a delete never removes a fingerprint the standby does not
--   have (which could be another item's). After the replay (dual = direct), the standby gets the
--   operation too; an error there is recorded in its metadata (dual_error), and that standby is
--   never swapped in. A standby whose rebuild failed or was interrupted is left alone.
-- cf_replay KEYS: standby, standby metadata, log, lock; ARGV: generation, lock token, entries read,
--   then the operations to apply, in order ('+item', '-item'): applies them, drops the first
--   `entries read` entries of the log, and when the log is empty switches the standby to direct
--   dual writes, all in one step. Answers the entries left in the log.

do
local LOG_TTL_MS = 86400000

local function engine_of(key)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'MBbloomCF' then
    return 'cf'
  elseif kind == 'string' then
    return 'lua'
  elseif kind == 'none' then
    return nil
  end
  return false
end

local function message(e)
  if type(e) == 'table' then
    return tostring(e.err or 'error')
  end
  return tostring(e)
end

local function apply(engine, key, op, items)
  if engine == 'cf' then
    if op == 'add' then
      return redis.call('CF.INSERT', key, 'NOCREATE', 'ITEMS', unpack(items))
    end
    local out = {}
    for n = 1, #items do
      out[n] = redis.call('CF.DEL', key, items[n])
    end
    return out
  end
  local reply
  if op == 'add' then
    reply = HANDLERS.cf_madd[1]({key}, items)
  else
    reply = HANDLERS.cf_mdel[1]({key}, items)
  end
  if reply.err then
    error({err = reply.err})
  end
  return reply
end

-- Where the standby stands: 'log' (a rebuild loads it: append to its log), 'direct' (write it too),
-- or nil (no standby, or one no rebuild is working on: leave it alone). Logging needs the rebuild's
-- lock to be there: a rebuild killed part-way leaves its standby 'loading', and the log must not
-- grow with every write until someone notices. A rebuild marks the metadata before it reserves the
-- standby, so logging starts at the mark: a write between the two is replayed, not lost.
local function standby_mode(keys)
  local meta = redis.call('HMGET', keys[3], 'state', 'dual')
  local state, mode = meta[1], meta[2]
  if mode == 'log' then
    if state == 'loading' and redis.call('EXISTS', keys[5]) == 1 then
      return 'log'
    end
    return nil
  end
  if state == 'failed' or state == 'interrupted' or redis.call('EXISTS', keys[2]) == 0 then
    return nil
  end
  return 'direct'
end

local function log_entries(keys, op, items)
  local mark = op == 'add' and '+' or '-'
  local entries = {}
  for n = 1, #items do
    entries[n] = mark .. items[n]
  end
  redis.call('RPUSH', keys[4], unpack(entries))
  redis.call('PEXPIRE', keys[4], LOG_TTL_MS)
end

local function cf_dual(keys, args)
  local op = args[1]
  if op ~= 'add' and op ~= 'del' then
    return redis.error_reply("ERR the operation must be 'add' or 'del'")
  end
  local items = {}
  for n = 2, #args do
    items[n - 1] = args[n]
  end
  local engine = engine_of(keys[1])
  if engine == false then
    return redis.error_reply('WRONGTYPE the active key does not hold a cuckoo filter')
  end
  local mode = #items > 0 and standby_mode(keys) or nil
  if engine == nil then
    -- a first build: no active filter yet, but a loading standby keeps the write for its replay
    if mode == 'log' then
      log_entries(keys, op, items)
    end
    return redis.error_reply('ERR not found')
  end
  local ok, flags = pcall(apply, engine, keys[1], op, items)
  if not ok then
    return redis.error_reply(message(flags))
  end
  if mode == 'log' then
    log_entries(keys, op, items)
    return flags
  elseif mode == nil then
    return flags
  end
  local standby = engine_of(keys[2])
  local done, problem = pcall(apply, standby, keys[2], op, items)
  if done and op == 'add' then
    for n = 1, #problem do
      if problem[n] ~= 1 then
        done, problem = false, 'no room for an item in the standby'
        break
      end
    end
  end
  if not done then
    redis.call('HSET', keys[3], 'dual_error', string.sub(message(problem), 1, 200))
  end
  return flags
end

local function cf_replay(keys, args)
  local lock = redis.call('GET', keys[4])
  if not lock or not string.find(lock, args[2], 1, true) then
    return redis.error_reply('BLOOMCTL lost the lock (it expired): the replay stopped')
  end
  if redis.call('HGET', keys[2], 'generation') ~= args[1] then
    return redis.error_reply('BLOOMCTL the standby was replaced by another run')
  end
  local engine = engine_of(keys[1])
  if not engine then
    return redis.error_reply('BLOOMCTL the standby is missing')
  end
  for n = 4, #args do
    local entry = args[n]
    local op = string.sub(entry, 1, 1) == '+' and 'add' or 'del'
    local flags = apply(engine, keys[1], op, {string.sub(entry, 2)})
    if op == 'add' and flags[1] ~= 1 then
      return redis.error_reply('BLOOMCTL no room in the standby for a write made during the rebuild')
    end
  end
  local read = tonumber(args[3])
  if read > 0 then
    redis.call('LTRIM', keys[3], read, -1)
  end
  local left = redis.call('LLEN', keys[3])
  if left == 0 then
    redis.call('HSET', keys[2], 'dual', 'direct')
  end
  return left
end

HANDLERS.cf_dual = {cf_dual, false}
HANDLERS.cf_replay = {cf_replay, false}
end
