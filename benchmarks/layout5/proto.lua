#!lua name=queasy5proto
--[[
queasy5proto: a measured prototype of a 5.0 stored layout (issue 14, server side). NOT the
library: nothing in queasy_py calls it; benchmarks/layout5/cost.py loads it next to the
library (its own name, its own functions) and runs a no-op job's path through both.

The question it answers: does a layout whose dispatch, dequeue and finish issue per-call
variadic commands (instead of per-job ones) reach ~55k server instructions (10 µs) a job
with the no-op path's guarantees kept: singleton by id (a duplicate of an active id waits,
blocked, and is promoted when the active one ends), leases (a stale token is refused, a
dead client's leases are swept back to waiting), outcome events, the kept ends under a
count and age retention, the stats counters, argument checks as the library's.

Key layout (B: a queue's base key, as lua/queasy.lua's; KEYS[1] is B):

  key                  type    holds
  B:waiting            zset    id -> run_at (ms) of each waiting or delayed job (as 4.x)
  B:rec                hash    (variant 'string', q5_*) id -> the record of each job that
                               lives (waiting, delayed or active: never renamed), one string
                               "<run_at> <enqueued_at> <retry_count> <stall_count>
                               <timeout_count>\t<attempts>\t<trace>\t<data>" (trace '' none;
                               data last: it may hold anything). A job is active when it has
                               a record and is not in B:waiting (its lease: B:lease:<client>)
  B:job:<id>           hash    (variant 'hash', q5h_*) the same record as a small hash per
                               job: data, run_at, enqueued_at (+ trace, counts and attempts
                               while not 0): 4.x's fields, never renamed either
  B:blocked            hash    id -> "<u_data> <u_reset> <record string>": the job dispatched
                               while its id is active, with its update flags (one field per
                               id: no key, no set of its own)
  B:lease:<client>     hash    id -> "<token> <leased_at>" (as 4.0.0; finish reads the
                               record for its numbers: one HMGET per call)
  B:events             stream  ONE entry per call: field `events`, the call's outcome lines
                               joined by '\n' (each "<outcome> <id> <ended_at> <started_at>
                               <pid> <run_at> <enqueued_at> <retry_count> <stall_count>
                               <timeout_count> <client>", '-' unknown). MAXLEN counts entries
  B:ends               hash    id -> "<state> <ended_at> <started_at> <pid> <attempts>
                               <run_at> <enqueued_at> <retry_count> <stall_count>
                               <timeout_count> <client> <host>" (as 4.x), + "\n<result>"
                               when the handler returned one (no B:ended:<id> key)
  B:finished           list    one element per finish call, oldest first: "<ended_at> <id>
                               <id> ...": the index the retention trims (whole elements;
                               the count is B:ends's HLEN: with failed and cancelled ends
                               there too, a 5.0 would count each state in B:stats)
  B:stats              hash    finished, finished:<minute> (as 4.x)
  B:expiry, B:fresh, B:swept, B:parked: as 4.x (a client's liveness; dequeue clears the
                               client's parked slots, but nothing parks: pushes left out)

Left out (not on a no-op job's path; none changes what that path runs): retry and fail,
cancel, schedules, dispatch_once windows, pushes to parked clients, results kept whole with
the record, the composed run_at updates of a blocked job (u_run_at/u_lo/u_hi: only the
requeue of its active job reads them), the readers, the migration guard's TRYAGAIN reply
(its keys are read as 4.2.0 reads them: with the first read).

Codes as lua/queasy.lua's: dispatch 1 created, 2 updated, 3 blocked (new), 4 blocked
(updated); finish 0 ok, 1 stale; dequeue status 0 ok, 2 swept. Refused calls: 'INVALID ...'.
]]

local call, find, format = nil, nil, nil
local MAX_MS = 253402300799999
local MAX_COUNT = 999999999999
local MAX_ID_CHARS = 256
local MAX_TEXT = 65536
local MAX_BATCH = 1000
local MAX_TRACE = 256
local TOMBSTONE_MS = 86400000
local RUN_AT_MODES = {replace = true, keep = true, if_later = true, if_earlier = true}

-- ---------------------------------------------------------------- checks (as lua/queasy.lua's)

local function invalid(what)
  error({err = 'INVALID ' .. what})
end

local function shown(arg)
  if arg == nil then
    return 'nothing'
  end
  arg = tostring(arg)
  if #arg > 40 then
    arg = string.sub(arg, 1, 40) .. '...'
  end
  return "'" .. string.gsub(arg, '[%z\1-\31\127]', '?') .. "'"
end

local function label(name, n)
  return n == nil and name or ('job ' .. n .. ' ' .. name)
end

local function whole(arg, name, max, n)
  if type(arg) ~= 'string' or #arg > 15 or find(arg, '^%d+$') == nil or tonumber(arg) > max then
    invalid(label(name, n) .. ' must be a whole number 0..' .. format('%d', max) .. ', got '
      .. shown(arg))
  end
  return tonumber(arg)
end

local function ms(arg, name, n)
  return whole(arg, name .. ' (integer ms since the epoch)', MAX_MS, n)
end

local function flag(arg, name)
  if arg == '1' or arg == 'true' then
    return true
  elseif arg == '0' or arg == 'false' then
    return false
  end
  invalid(name .. " must be '1' or '0', got " .. shown(arg))
end

local function clock(arg)
  if arg ~= nil and arg ~= '' then
    return ms(arg, 'now')
  end
  local t = call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The id rules of queasy_py/validate.py (lua/queasy.lua's check_id).
local function check_id(arg, name, n)
  if type(arg) ~= 'string' or arg == '' or #arg > 4 * MAX_ID_CHARS then
    invalid(label(name, n) .. ' must be 1-256 characters, got ' .. shown(arg))
  end
  if find(arg, '[^!-~]') == nil then
    if #arg > MAX_ID_CHARS then
      invalid(label(name, n) .. ' must be 1-256 characters, got ' .. shown(arg))
    end
    return arg
  end
  local chars = #arg - select(2, string.gsub(arg, '[\128-\191]', ''))
  if chars > MAX_ID_CHARS then
    invalid(label(name, n) .. ' must be 1-256 characters, got ' .. shown(arg))
  end
  if find(arg, '[%z\1-\32\127]') or find(arg, '\194[\128-\160]')
      or find(arg, '\225\154\128') or find(arg, '\226\128[\128-\138\168\169\175]')
      or find(arg, '\226\129\159') or find(arg, '\227\128\128') then
    invalid(label(name, n) .. ' contains whitespace or control characters: ' .. shown(arg))
  end
  return arg
end

local function strict_json(check)
  local lenient = cjson.decode_invalid_numbers()
  cjson.decode_invalid_numbers(false)
  local ok, err = pcall(check)
  cjson.decode_invalid_numbers(lenient)
  if not ok then
    error(err, 0)
  end
end

local function check_json(arg, name, n)
  if not pcall(cjson.decode, arg) then
    local _, err = pcall(cjson.decode, arg)
    invalid(label(name, n) .. ' is not JSON (' .. tostring(err) .. ')')
  end
end

local function text(arg, name)
  if type(arg) ~= 'string' or #arg > MAX_TEXT then
    invalid(name .. ' must be text of at most ' .. MAX_TEXT .. ' bytes')
  end
  return arg
end

local function groups(args, from, width, name)
  local n = #args - from + 1
  if n % width ~= 0 then
    invalid(name .. ': ARGV from ' .. from .. ' must come in groups of ' .. width .. ', got '
      .. n .. ' values')
  elseif n / width > MAX_BATCH then
    invalid(name .. ': at most ' .. MAX_BATCH .. ' jobs per call, got ' .. n / width)
  end
end

-- ---------------------------------------------------------------- helpers

-- A new list with room for 32 values (lua/queasy.lua's list(): no resize on the way to 32).
local function list()
  return {nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
    nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil}
end

local int_n, int_s = nil, nil
local function int(n)
  if n ~= int_n then
    int_n, int_s = n, format('%d', n)
  end
  return int_s
end

local SMALL = {}
local function small(n)
  local s = SMALL[n]
  if s == nil then
    s = format('%d', n)
    if n <= 1000 then
      SMALL[n] = s
    end
  end
  return s
end

local function merge_run_at(current, new, mode)
  if mode == 'replace' then
    return new
  elseif mode == 'if_later' then
    return math.max(current, new)
  elseif mode == 'if_earlier' then
    return math.min(current, new)
  end
  return current
end

-- A record string's parts: run_at, enqueued_at, retry, stall, timeout, attempts (strings),
-- trace, data; nil for a value that is not a record (written around the library). A record
-- is "<run_at> <enqueued_at> <retry> <stall> <timeout>\t<attempts>\t<trace>\t<data>": the
-- numbers an event repeats first, as one piece, and tabs around the parts the hot path takes
-- apart with plain finds (a pattern of seven captures cost dequeue ~8k instructions a job).
local REC = '^(%d+) (%d+) (%d+) (%d+) (%d+)\t(%d+)\t([^\t]*)\t()'
local function parse(v)
  local run_at, enq, retry, stall, timeout, attempts, trace, p = string.match(v, REC)
  if run_at == nil then
    return nil
  end
  return run_at, enq, retry, stall, timeout, attempts, trace, string.sub(v, p)
end

local function record(run_at, enq, retry, stall, timeout, attempts, trace, data)
  return run_at .. ' ' .. enq .. ' ' .. retry .. ' ' .. stall .. ' ' .. timeout .. '\t'
    .. attempts .. '\t' .. trace .. '\t' .. data
end

-- The two ways to keep a record ('string': a field of B:rec; 'hash': a key B:job:<id>),
-- each as read(ids) -> list of record strings or false, write(id, record string, fresh)
-- into a batch flushed by flush() (`fresh`: no record of that id before), drop(ids).
local HASH_FIELDS = {'run_at', 'enqueued_at', 'retry_count', 'stall_count', 'timeout_count',
  'attempts', 'trace', 'data'}
local function store_of(B, hashed)
  local rkey = B .. ':rec'
  local pending = {}
  local s = {}
  if not hashed then
    function s.read(ids)
      return call('HMGET', rkey, unpack(ids))
    end
    function s.write(id, rec)
      pending[#pending + 1] = id
      pending[#pending + 1] = rec
    end
    function s.flush()
      if #pending > 0 then
        call('HSET', rkey, unpack(pending))
        pending = {}
      end
    end
    function s.drop(ids)
      call('HDEL', rkey, unpack(ids))
    end
    return s
  end
  function s.read(ids)
    local out = {}
    for k, id in ipairs(ids) do
      local v = call('HMGET', B .. ':job:' .. id, unpack(HASH_FIELDS))
      out[k] = v[1] and v[2] and v[8] and record(v[1], v[2], v[3] or '0', v[4] or '0',
        v[5] or '0', v[6] or '0', v[7] or '', v[8]) or false
    end
    return out
  end
  function s.write(id, rec, fresh) -- the fields that are not 0 (others absent: read as 0)
    local run_at, enq, retry, stall, timeout, attempts, trace, data = parse(rec)
    local key = B .. ':job:' .. id
    local f = {'run_at', run_at, 'enqueued_at', enq, 'data', data}
    local del = {}
    for i, v in ipairs({retry, stall, timeout, attempts, trace}) do
      local name = HASH_FIELDS[i + 2]
      if v ~= '0' and v ~= '' then
        f[#f + 1], f[#f + 2] = name, v
      else
        del[#del + 1] = name
      end
    end
    call('HSET', key, unpack(f))
    if not fresh and #del > 0 then
      call('HDEL', key, unpack(del))
    end
  end
  function s.flush()
  end
  function s.drop(ids)
    local keys = {}
    for k, id in ipairs(ids) do
      keys[k] = B .. ':job:' .. id
    end
    call('DEL', unpack(keys))
  end
  return s
end

-- The events of a call, as one stream entry (none while maxlen is 0).
local function append_events(B, maxlen, lines)
  if maxlen > 0 and #lines > 0 then
    call('XADD', B .. ':events', 'MAXLEN', '~', maxlen, '*', 'events', table.concat(lines, '\n'))
  end
end

-- ---------------------------------------------------------------- q5_dispatch

--[[ q5_dispatch: add or update jobs.
KEYS[1] B; ARGV as queasy_dispatch: now, update_data, update_run_at, reset_counts, trace,
then triples id, data (JSON), run_at ('' now).
Per call: HMGET of B:rec for all ids (variant 'hash': an HMGET per id), a ZMSCORE of
B:waiting only when an id has a record, an HMGET of B:blocked only when an id is active, one
HSET of B:rec, one ZADD of B:waiting, one SPUBLISH of B:wake.
Returns one code per job (1-4).
]]
local function dispatch(B, args, hashed)
  local now = clock(args[1])
  local update_data = flag(args[2], 'update_data')
  local mode = args[3]
  if not RUN_AT_MODES[mode] then
    invalid("update_run_at must be 'replace', 'keep', 'if_later' or 'if_earlier', got "
      .. shown(mode))
  end
  local reset = flag(args[4], 'reset_counts')
  local trace = args[5]
  if type(trace) ~= 'string' or #trace > MAX_TRACE or find(trace, '[^0-9a-f%-]') then
    invalid('trace must be a W3C traceparent (0-9 a-f and -, at most ' .. MAX_TRACE .. ' bytes)')
  end
  groups(args, 6, 3, 'q5_dispatch')
  local ids, run_ats = {}, {}
  strict_json(function()
    local decode = cjson.decode
    local valid = pcall(function()
      for i = 7, #args, 3 do
        decode(args[i])
      end
    end)
    for i = 6, #args, 3 do
      local n = (i - 6) / 3 + 1
      ids[n] = check_id(args[i], 'id', n)
      if not valid then
        check_json(args[i + 1], 'data', n)
      end
      run_ats[n] = args[i + 2] == '' and now or ms(args[i + 2], 'run_at', n)
    end
  end)
  local codes = {}
  if #ids == 0 then
    return codes
  end
  local store = store_of(B, hashed)
  local now_s = int(now)
  local recs = store.read(ids)
  -- which ids with a record are waiting (else active): one ZMSCORE, only when there are any
  local existing = {}
  for k, id in ipairs(ids) do
    if recs[k] then
      existing[#existing + 1] = id
    end
  end
  local waiting, blocked = {}, {}
  if #existing > 0 then
    local scores = call('ZMSCORE', B .. ':waiting', unpack(existing))
    local active = {}
    for k, id in ipairs(existing) do
      waiting[id] = scores[k] ~= false
      if not waiting[id] then
        active[#active + 1] = id
      end
    end
    if #active > 0 then
      local b = call('HMGET', B .. ':blocked', unpack(active))
      for k, id in ipairs(active) do
        blocked[id] = b[k]
      end
    end
  end
  -- the state of each id as this call leaves it (a later triple of the same id sees it)
  local rec = {} -- id -> record string (a waiting or new job's)
  for k, id in ipairs(ids) do
    if rec[id] == nil and recs[k] and waiting[id] then
      if parse(recs[k]) then
        rec[id] = recs[k]
      else -- a record garbled around the prototype: replaced as a new one (4.x reads 0s)
        waiting[id] = nil
      end
    end
  end
  local zadd, blocks, order, earliest, recs_new = {}, {}, {}, nil, {}
  for k, id in ipairs(ids) do
    local data, run_at, code = args[3 * k + 4], run_ats[k], nil
    local current = rec[id]
    if current == nil and waiting[id] == nil then -- a new id (or new in this call)
      rec[id] = int(run_at) .. ' ' .. now_s .. ' 0 0 0\t0\t' .. trace .. '\t' .. data
      recs_new[id] = true
      code = 1
    elseif current ~= nil then -- waiting: an update
      local r, enq, retry, stall, timeout, attempts, tr, old = parse(current)
      r = merge_run_at(tonumber(r), run_at, mode)
      run_at = r
      if reset then
        retry, stall, timeout = '0', '0', '0'
      end
      rec[id] = record(int(r), enq, retry, stall, timeout, attempts, tr,
        update_data and data or old)
      code = 2
    else -- active: a blocked job waits for it
      local b = blocks[id] or blocked[id]
      if b then
        local u_data, u_reset, r, enq, retry, stall, timeout, attempts, tr, old
        u_data, u_reset, r = string.match(b, '^(%d) (%d) ()')
        r, enq, retry, stall, timeout, attempts, tr, old = parse(string.sub(b, r))
        r = merge_run_at(tonumber(r), run_at, mode)
        if reset then
          retry, stall, timeout = '0', '0', '0'
        end
        blocks[id] = ((update_data or u_data == '1') and '1' or '0') .. ' '
          .. ((reset or u_reset == '1') and '1' or '0') .. ' '
          .. record(int(r), enq, retry, stall, timeout, attempts, tr,
            update_data and data or old)
        codes[k] = 4
      else
        blocks[id] = (update_data and '1' or '0') .. ' ' .. (reset and '1' or '0') .. ' '
          .. int(run_at) .. ' ' .. now_s .. ' 0 0 0\t0\t' .. trace .. '\t' .. data
        codes[k] = 3
      end
      blocked[id] = blocks[id]
    end
    if code ~= nil then
      codes[k] = code
      if not zadd[id] then
        order[#order + 1] = id
      end
      zadd[id] = run_at
      if earliest == nil or run_at < earliest then
        earliest = run_at
      end
    end
  end
  local scored = {}
  for _, id in ipairs(order) do
    store.write(id, rec[id], recs_new[id])
    scored[#scored + 1] = int(zadd[id])
    scored[#scored + 1] = id
  end
  store.flush()
  if #scored > 0 then
    call('ZADD', B .. ':waiting', unpack(scored))
  end
  local b = {}
  for id, v in pairs(blocks) do
    b[#b + 1], b[#b + 2] = id, v
  end
  if #b > 0 then
    call('HSET', B .. ':blocked', unpack(b))
  end
  if earliest ~= nil then
    call('SPUBLISH', B .. ':wake', int(earliest))
  end
  return codes
end

-- ---------------------------------------------------------------- q5_dequeue

-- Sweep one dead client (expiry passed) other than `self`: its leased jobs go back to
-- waiting now with stall_count + 1 and this lease counted in attempts (a blocked job of
-- the same id takes its place as 4.x's requeue merges it: its data with u_data, its counts
-- reset with u_reset), one 'stalled' event line each.
local function sweep_one(B, now, self, maxlen, hashed)
  local dead = call('ZRANGE', B .. ':expiry', '-inf', int(now), 'BYSCORE', 'LIMIT', 0, 2)
  for _, client in ipairs(dead) do
    if client ~= self then
      local lkey = B .. ':lease:' .. client
      local flat = call('HGETALL', lkey)
      local ids = {}
      for k = 1, #flat, 2 do
        ids[#ids + 1] = flat[k]
      end
      if #ids > 0 then
        local store = store_of(B, hashed)
        local recs = store.read(ids)
        local b = call('HMGET', B .. ':blocked', unpack(ids))
        local lines, scored, unblocked = {}, {}, {}
        for k, id in ipairs(ids) do
          local r, enq, retry, stall, timeout, attempts, tr, data = nil, nil, nil, nil, nil,
            nil, nil, nil
          if recs[k] then
            r, enq, retry, stall, timeout, attempts, tr, data = parse(recs[k])
          end
          if r ~= nil then
            stall = int(tonumber(stall) + 1)
            attempts = int(tonumber(attempts) + 1)
            lines[#lines + 1] = 'stalled ' .. id .. ' ' .. int(now) .. ' - - ' .. r .. ' ' .. enq
              .. ' ' .. retry .. ' ' .. stall .. ' ' .. timeout .. ' ' .. client
            if b[k] then
              local u_data, u_reset, p = string.match(b[k], '^(%d) (%d) ()')
              local _, _, _, _, _, _, _, bdata = parse(string.sub(b[k], p))
              if u_data == '1' then
                data = bdata
              end
              if u_reset == '1' then
                retry, stall, timeout = '0', '0', '0'
              end
              unblocked[#unblocked + 1] = id
            end
            store.write(id, record(int(now), enq, retry, stall, timeout, attempts, tr, data))
            scored[#scored + 1], scored[#scored + 2] = int(now), id
          end
        end
        store.flush()
        if #scored > 0 then
          call('ZADD', B .. ':waiting', unpack(scored))
        end
        if #unblocked > 0 then
          call('HDEL', B .. ':blocked', unpack(unblocked))
        end
        append_events(B, maxlen, lines)
      end
      call('DEL', lkey)
      call('HDEL', B .. ':parked', client)
      call('ZREM', B .. ':expiry', client)
      call('ZREM', B .. ':fresh', client)
      call('ZADD', B .. ':swept', int(now), client)
      call('ZREMRANGEBYSCORE', B .. ':swept', '-inf', int(now - TOMBSTONE_MS))
      return
    end
  end
end

--[[ q5_dequeue: check out up to `limit` ready jobs for one client.
KEYS[1] B; ARGV as queasy_dequeue: now, client id, nonce, limit, expiry ms, events maxlen.
Per call: EXISTS (B:parked + the guard's keys), the sweep's ZRANGE, ZSCORE of B:swept, two
ZADDs (expiry, fresh), ZRANGE of B:waiting, one HMGET of B:rec (variant 'hash': one per
job), one ZREM, one HSET of B:lease:<client>, ZRANGE for the next run_at. The record is not
written (no rename: active = a record not in B:waiting).
Returns {status, next_run_at, id, token, record, ...}: the record string as stored (the
client splits it: its attempts do not count this lease; finish counts it).
]]
local function dequeue(B, args, hashed)
  local now = clock(args[1])
  local client = check_id(args[2], 'client id')
  local nonce = check_id(args[3], 'nonce')
  local limit = math.min(whole(args[4], 'limit', MAX_COUNT), MAX_BATCH)
  local expiry_ms = whole(args[5], 'expiry ms', MAX_COUNT)
  local maxlen = whole(args[6], 'events maxlen', MAX_COUNT)
  if expiry_ms < 1 then
    invalid('expiry ms must be >= 1, got 0')
  end
  local parked = call('EXISTS', B .. ':parked', B .. ':guard:1', B .. ':guard:2')
  sweep_one(B, now, client, maxlen, hashed)
  if call('ZSCORE', B .. ':swept', client) ~= false then
    return {2, ''}
  end
  call('ZADD', B .. ':expiry', int(now + expiry_ms), client)
  call('ZADD', B .. ':fresh', int(now + math.floor(expiry_ms / 2)), client)
  local out = list()
  out[1], out[2] = 0, ''
  if limit > 0 then
    local ids = call('ZRANGE', B .. ':waiting', '-inf', int(now), 'BYSCORE', 'LIMIT', 0, limit)
    if #ids > 0 then
      local recs = store_of(B, hashed).read(ids)
      local leases, taken, o, now_s = list(), 0, 2, int(now)
      for k, id in ipairs(ids) do
        local v = recs[k]
        if v then -- (a stray id without a record: only dropped from B:waiting)
          taken = taken + 1
          local token = nonce .. '.' .. small(taken)
          leases[2 * taken - 1] = id
          leases[2 * taken] = token .. ' ' .. now_s
          -- the record as it is: the client takes it apart (no pattern here)
          out[o + 1], out[o + 2], out[o + 3] = id, token, v
          o = o + 3
        end
      end
      call('ZREM', B .. ':waiting', unpack(ids))
      if taken > 0 then
        call('HSET', B .. ':lease:' .. client, unpack(leases))
      end
    end
    if parked > 0 then
      call('HDEL', B .. ':parked', client)
    end
  end
  local first = call('ZRANGE', B .. ':waiting', 0, 0, 'WITHSCORES')
  out[2] = first[2] or ''
  return out
end

-- ---------------------------------------------------------------- q5_finish

-- Keep the ends of this call (`ids`, `ends`: {id, end, ...}, all ended at `ended`, a
-- string) and drop the oldest calls' while more than `count` are kept or the oldest is
-- older than `age_ms`: at most two calls' per call (so what is kept shrinks back after the
-- retention is lowered). An id whose end is newer than the element that drops it (it ended
-- again) keeps its end: only the ends whose ended_at is the element's go.
local function retain(B, now, count, age_ms, ids, ends, ended)
  local lkey, ekey = B .. ':finished', B .. ':ends'
  if #ids > 0 and count > 0 and age_ms > 0 then
    call('HSET', ekey, unpack(ends))
    call('RPUSH', lkey, ended .. ' ' .. table.concat(ids, ' '))
  end
  for _ = 1, 2 do
    local over = call('HLEN', ekey) > count
    local oldest = over and call('LPOP', lkey) or nil
    if not over then -- the age: the oldest element's ended_at (its first word)
      local first = call('LINDEX', lkey, 0)
      -- (an element garbled around the library reads as not old: no error after the writes)
      local at = first and tonumber(string.sub(first, 1, (find(first, ' ', 1, true) or 1) - 1))
      if at and at < now - age_ms then
        oldest = call('LPOP', lkey)
      end
    end
    if not oldest then
      return
    end
    local dropped, at = {}, nil
    for word in string.gmatch(oldest, '%S+') do
      if at == nil then
        at = 'finished ' .. word .. ' '
      else
        dropped[#dropped + 1] = word
      end
    end
    if #dropped > 0 then
      local v = call('HMGET', ekey, unpack(dropped))
      local gone = {}
      for k, id in ipairs(dropped) do
        if v[k] and find(v[k], at, 1, true) == 1 then
          gone[#gone + 1] = id
        end
      end
      if #gone > 0 then
        call('HDEL', ekey, unpack(gone))
      end
    end
  end
end

local function tally(B, now, n)
  local skey = B .. ':stats'
  local minute = math.floor(now / 60000)
  local bucket = 'finished:' .. int(minute)
  local v = call('HMGET', skey, 'finished', bucket)
  local total, this = tonumber(v[1]) or 0, tonumber(v[2]) or 0
  call('HSET', skey, 'finished', int(total + n), bucket, int(this + n))
  if this == 0 then -- a minute's first count drops the buckets older than an hour
    local stale = {}
    for _, f in ipairs(call('HKEYS', skey)) do
      local m = tonumber(string.match(f, ':(%d+)$'))
      if m ~= nil and m < minute - 60 then
        stale[#stale + 1] = f
      end
    end
    if #stale > 0 then
      call('HDEL', skey, unpack(stale))
    end
  end
end

--[[ q5_finish: jobs completed.
KEYS[1] B; ARGV as queasy_finish: now, client id, events maxlen, keep count, keep ms, host,
notify, then quintuples id, token, pid, started_at, result ('' none, else JSON).
Per call: EXISTS (B:blocked + the guard's keys), HMGET of the lease hash, HMGET of B:rec
(variant 'hash': one HMGET per job), HDEL of the lease hash, HDEL of B:rec (variant 'hash':
one DEL of the keys), one XADD of the call's event lines, HSET of the ends and RPUSH of
their ids, the trim (HLEN, LPOP, HMGET and HDEL of the ends; LINDEX when under the count),
HMGET and HSET of B:stats; with blocked jobs, one HMGET of B:blocked and per call one HSET
(B:rec), ZADD, HDEL and SPUBLISH for those promoted.
Returns one code per job: 0 ok, 1 stale.
]]
local function finish(B, args, hashed)
  local now = clock(args[1])
  local client = check_id(args[2], 'client id')
  local maxlen = whole(args[3], 'events maxlen', MAX_COUNT)
  local keep_count = whole(args[4], 'keep count', MAX_COUNT)
  local keep_ms = whole(args[5], 'keep ms', MAX_MS)
  local host = text(args[6], 'host')
  local notify = flag(args[7], 'notify')
  groups(args, 8, 5, 'q5_finish')
  local ids = list()
  for i = 8, #args, 5 do
    local n = (i - 8) / 5 + 1
    ids[n] = args[i]
    local pid, started = args[i + 2], args[i + 3]
    if pid ~= '' and not (#pid <= 7 and find(pid, '^%d+$')) then
      whole(pid, 'worker pid', MAX_COUNT, n)
    end
    if started ~= '' and not (#started <= 14 and find(started, '^%d+$')) then
      ms(started, 'started_at', n)
    end
    if args[i + 4] ~= '' then
      strict_json(function()
        check_json(args[i + 4], 'result', n)
      end)
    end
  end
  local codes = list()
  if #ids == 0 then
    return codes
  end
  local any_blocked = call('EXISTS', B .. ':blocked', B .. ':guard:1', B .. ':guard:2') > 0
  local lkey = B .. ':lease:' .. client
  local held = call('HMGET', lkey, unpack(ids))
  local cands, at_k, seen = list(), list(), {}
  for k, id in ipairs(ids) do
    local token, v = args[8 + (k - 1) * 5 + 1], held[k]
    -- the lease is "<token> <leased_at>" (a token holds no space)
    if v and not seen[id] and find(v, token, 1, true) == 1 and string.byte(v, #token + 1) == 32
        and not find(token, ' ', 1, true) then
      seen[id] = true
      cands[#cands + 1] = id
      at_k[#cands] = k
    end
    codes[k] = 1
  end
  if #cands == 0 then
    return codes
  end
  local store = store_of(B, hashed)
  local recs = store.read(cands)
  local ended = int(now)
  local taken, lines, ends = list(), list(), list()
  for c, id in ipairs(cands) do
    local v = recs[c]
    -- "<run_at> <enqueued_at> <retry> <stall> <timeout>\t<attempts>\t...": two plain finds
    local t1 = v and find(v, '\t', 1, true)
    local t2 = t1 and find(v, '\t', t1 + 1, true)
    local attempts = t2 and tonumber(string.sub(v, t1 + 1, t2 - 1))
    if attempts then -- (no record, or one garbled around the library: stale)
      local k = at_k[c]
      local i = 8 + (k - 1) * 5
      codes[k] = 0
      taken[#taken + 1] = id
      local counts = string.sub(v, 1, t1 - 1)
      local pid, started = args[i + 2], args[i + 3]
      pid, started = pid == '' and '-' or pid, started == '' and '-' or started
      local at = ended .. ' ' .. started .. ' ' .. pid .. ' '
      if maxlen > 0 then
        lines[#lines + 1] = 'finished ' .. id .. ' ' .. at .. counts .. ' ' .. client
      end
      local line = 'finished ' .. at .. small(attempts + 1) .. ' ' .. counts .. ' ' .. client
        .. ' ' .. host
      if args[i + 4] ~= '' then
        line = line .. '\n' .. args[i + 4]
      end
      ends[#ends + 1], ends[#ends + 2] = id, line
    end
  end
  if #taken == 0 then
    return codes
  end
  call('HDEL', lkey, unpack(taken))
  store.drop(taken)
  append_events(B, maxlen, lines)
  retain(B, now, keep_count, keep_ms, taken, ends, ended)
  tally(B, now, #taken)
  if any_blocked then -- promote: each blocked job of an id that ended becomes waiting
    local b = call('HMGET', B .. ':blocked', unpack(taken))
    local up, zadd, earliest = {}, {}, nil
    for k, id in ipairs(taken) do
      if b[k] then
        local rec = string.sub(b[k], 5)
        local run_at = string.match(rec, '^%d+')
        store.write(id, rec)
        up[#up + 1] = id
        zadd[#zadd + 1], zadd[#zadd + 2] = run_at, id
        if earliest == nil or tonumber(run_at) < earliest then
          earliest = tonumber(run_at)
        end
      end
    end
    if #up > 0 then
      store.flush()
      call('ZADD', B .. ':waiting', unpack(zadd))
      call('HDEL', B .. ':blocked', unpack(up))
      call('SPUBLISH', B .. ':wake', int(earliest))
    end
  end
  if notify then
    for _, id in ipairs(taken) do
      call('SPUBLISH', B .. ':done:' .. id, 'finished')
    end
  end
  return codes
end

-- ---------------------------------------------------------------- registration

local function entry(fn, hashed)
  return function(keys, args)
    call, find, format = redis.call, string.find, string.format
    return fn(keys[1], args, hashed)
  end
end

redis.register_function('q5_dispatch', entry(dispatch, false))
redis.register_function('q5_dequeue', entry(dequeue, false))
redis.register_function('q5_finish', entry(finish, false))
redis.register_function('q5h_dispatch', entry(dispatch, true))
redis.register_function('q5h_dequeue', entry(dequeue, true))
redis.register_function('q5h_finish', entry(finish, true))
