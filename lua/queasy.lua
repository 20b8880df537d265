#!lua name=queasy
--[[
queasy: the one Redis function library of queasy_py (Redis >= 7.0, Valkey >= 7.2).

Every transition of a job is one FCALL of this library; Python never edits job keys.

Key layout. B is a queue's base key, built by queasy_py/keys.py only:
    B = <prefix>:{<tag>}:<queue name>
where <tag> is the name of the queue that owns the hash slot (a fail queue `emails-fail`
uses the tag of `emails`), so every key below, for a queue and its fail queue, lives in
one hash slot and every function is Redis-Cluster-safe. KEYS[1] is always B; functions
derive the keys below from it (same slot, so cluster routing holds).

  key                  type    holds
  B:waiting            zset    id -> run_at (ms) of waiting and delayed jobs (not blocked)
  B:rec                hash    id -> the record of each living job (waiting, delayed or active;
                               never renamed: 5.0.0), one string (see the section "records
                               (5.0 layout)"): "<run_at> <enqueued_at> <retry_count>
                               <stall_count> <timeout_count> <attempts>\t<trace>\t<data>":
                               enqueued_at (ms of the dispatch that made it, '-' unknown: a
                               record of 3.x upgraded), attempts (times leased before: an
                               active job's lease is not counted in it, readers add it), trace
                               (the W3C traceparent current at its dispatch, '' none:
                               OpenTelemetry). A job is active when it has a record and a
                               lease and is not in B:waiting
  B:err                hash    id -> the last error of a living job that failed an attempt:
                               cjson of {name, kind, message, traceback, at (ms, an integer
                               string)}; copied into B:ended:<id> (error_name, error_kind,
                               error_message, traceback, error_at) when the job ends (5.0.0)
  B:blocked            hash    id -> the job dispatched while its id is active, waiting for the
                               active one to end: "<u_data> <u_reset> <u_run_at> <u_lo>
                               <u_hi>\t<record string>" (the composed updates of its
                               dispatches, see run_at_update: u_data, u_reset '0'|'1', u_run_at
                               'replace'|'clamp', u_lo/u_hi digits or '-' for no bound) (5.0.0;
                               4.x: a set of ids whose record was B:job:<id>)
  B:layout             string  '5': B's keys are in the layout of library 5 (see "upgrade of
                               4.x data"); missing on a queue of 4.x not converted yet
  B:upgrade            hash    the progress of that conversion (waiting: the rank reached in
                               B:waiting; client: the clients of B:expiry done); gone after it
  B:ends               hash    id -> the end of each job kept after its end, one line:
                               "<state> <ended_at> <started_at> <pid> <attempts> <run_at>
                               <enqueued_at> <retry_count> <stall_count> <timeout_count>
                               <client> <host>" (state 'finished'|'failed'|'cancelled'; '-' for
                               a value unknown; the host last: it may hold spaces), written
                               once per call for all the jobs it ended
  B:ended:<id>         hash    the record of an ended job kept whole: a failed or cancelled
                               one, a finished one with a result (a queue that stores them)
                               or an earlier failed attempt; the active (or, cancelled,
                               waiting) record as it was, field by field as library 4.x kept
                               it (id, data, run_at, retry_count, stall_count, timeout_count,
                               enqueued_at, attempts, trace), + its last error's fields
                               (error_name, error_kind, error_message, traceback, error_at),
                               result (the handler's JSON return value). Other finished jobs
                               keep their end only (no data): the cheap path of every no-op job
  B:finished           zset    id -> ended_at (ms) of each end kept in that state: the index
  B:failed             zset    the retention trims (oldest first, a few per call) and listings
  B:cancelled          zset    page through. An id that ended again in another state may stay
                               in the index of the first until trimmed: B:ends says its state
  B:stats              hash    finished, failed: totals since a reset; finished:<minute>,
                               failed:<minute>: jobs that ended in that minute (epoch ms //
                               60000), the last hour's kept
  B:expiry             zset    client id -> expiry (ms) of each client holding leases here
  B:fresh              zset    client id -> until when (ms) it is fresh: half its expiry window
                               after its last dequeue or bump; pushes go to fresh clients only
  B:lease:<client>     hash    id -> "<token> <leased_at>" of each job this client has
                               checked out: its lease (5.1.0, the form of 4.0.0: an ack reads
                               the job's numbers from its record in B:rec). Library 4.1.0 to
                               5.0.0 wrote "<token> <run_at> <enqueued_at> <retry_count>
                               <stall_count> <timeout_count> <attempts> <leased_at>" (the
                               numbers of the active record, attempts counting this lease);
                               every reader still takes it, and the upgrade of 4.x data
                               rewrites the leases of 3.x, the token alone, and of 4.0.0 in
                               that form when their record has the numbers
  B:swept              zset    client id -> time it was swept (tombstones, kept 24 h)
  B:parked             hash    client id -> free slots it has parked here: an idle client's
                               dequeue leaves them, and dispatch leases a ready job straight
                               to a live parked client (a push) instead of queueing it
  B:seq                string  counter of push lease tokens ('p<n>')
  B:window:<size>:<k>  hash    id -> end (ms) of the window in which queasy_dispatch_once does
                               not dispatch <id> again (its run_at + window), for the windows
                               ending in [k * size, (k + 1) * size) of jobs ready at their
                               dispatch (size: window rounded up to a power of two ms);
                               expires at (k + 1) * size: 4.1.0
  B:windows            zset    "<size>:<k>" -> (k + 1) * size: the live B:window buckets
  B:once:<id>          string  end (ms) of a window of <id> that ends later than `window`
                               after its dispatch (a delayed job's; library 4.0.0 kept every
                               window so); expires then
  B:events             stream  one entry per job outcome (capped, MAXLEN ~): field `event`, one
                               line "<outcome> <id> <ended_at> <started_at> <pid> <run_at>
                               <enqueued_at> <retry_count> <stall_count> <timeout_count>
                               <client>" ('-' for a value unknown), and with an error only:
                               error_name, error_kind, error_message, traceback (its last
                               EVENT_TRACEBACK bytes). The queue is the stream's. (3.x wrote
                               16 fields per entry: id, queue, outcome, ...; readers take
                               both.) README "Outcome events": the schema, versioned with
                               this library
  B:schedule           hash    the queue's schedule (queasy_schedule): spec (its text), fire_at
                               (ms: fire time of the current occurrence, job id SCHEDULE_ID),
                               skipped (fire times catch-up passed over), and of the last
                               occurrence that ended: last_fire_at, last_outcome, last_ended_at;
                               dropped by queasy_unschedule while no occurrence exists (4.4.0)
  B:wake               channel SPUBLISHed when a dispatch may make a job ready earlier
  B:done:<id>          channel SPUBLISHed <state> when job <id> ends: finished or failed (when
                               the call asks to notify: the queue stores results), cancelled
  B:push:<client>      channel a job pushed to <client> (already leased to it), one per message:
                               "id\ntoken\nrun_at\nretry_count\nstall_count\ntimeout_count\n
                               trace\ndata" (trace '' when none, or longer than
                               MAX_TRACE or not of 0-9 a-f -: written around the
                               library; 4.3.0)
                               (ids hold no whitespace; data is last and may hold anything)
  B:guard:1, B:guard:2 never written: the migration guard reads them (see `entry`)

Library 5.0.0 (issue 14: a job's server cost) keeps every living record in the one hash
B:rec, the blocked jobs in the hash B:blocked and the last errors in B:err, where 4.x kept a
hash per record (B:job:<id> while waiting or blocked, renamed B:active:<id> while leased) and
a set of blocked ids; every reply, event, end, lease and channel is as 4.4.0's. A queue's keys
of 4.x are converted by the first write calls on it after 5.0.0 is loaded (see "upgrade of
4.x data": B:layout, queasy_upgrade). Library 5.1.0 (additive) writes leases in the short form
"<token> <leased_at>" (an ack reads the numbers from the record it reads anyway) and adds
queasy_dequeue's optional reply 'rec' (ARGV[8]: id, token and record per job); a 5.0.0
process keeps working against it (its dequeue's reply without ARGV[8] is as 5.0.0's, and
the leases of 4.1.0's form it wrote still ack).

Channels are sharded (SPUBLISH; subscribers use SSUBSCRIBE on the primary that owns B's
slot): on a Redis Cluster a message reaches the subscribers of its shard only, and PUBSUB
SHARDNUMSUB counts exactly them (PUBLISH counts the executing node's subscribers but delivers
cluster-wide: a push counted 0 would be a phantom).

Conventions: times are integer milliseconds since the epoch, 0 ..= 253402300799999 (year
9999), written in decimal digits (a fraction, exponent or sign is refused); every number the
library writes (fields, scores, stream fields, messages) is an integer string. ARGV[1] of every
function is `now` in ms, or the empty string to use the server's clock (TIME). Entry points
check every argument before their first write and turn ARGV strings into typed locals; helpers
never see the strings '0'/'1'/'false'. Id rules (job ids, client ids, nonces, marks, fail job
ids): 1-256 characters, no whitespace or control character.

Refused calls: an error reply 'INVALID <what is wrong>' (queasy_py raises InvalidInput), and
nothing written; 'TRYAGAIN ...' while the queue's hash slot moves between cluster nodes (the
migration guard of `entry`: nothing read or written, the caller retries after a backoff);
'TRYAGAIN upgrading <B> ...' while the queue's keys of library 4.x are converted (a write call
converted a step of them and did nothing else; a read-only call cannot convert: queasy_py
calls queasy_upgrade until it returns 0, then tries again).

Result codes (queasy_py/store/library.py maps them to an enum):
  dispatch: 1 created, 2 updated (waiting job), 3 blocked (new), 4 blocked (updated)
  dispatch_once: 1 created, 2 updated, 5 skipped (active, or dispatched within its window)
  finish/retry/fail: 0 ok, 1 stale (this client no longer holds that lease)
  dequeue/bump: status 0 ok, 2 swept (this client was swept as dead; start over)

Retention: finish, fail and cancel keep the end of each job that ended (B:ends, and its
record when kept whole) while it is among the newest `keep count` of its state and younger
than `keep ms`; each call drops at most (jobs it ended + 2) of the oldest beyond that, so no
call does O(N) work and what is kept shrinks back after the retention is lowered.
]]

local VERSION = '5.1.1'
-- the functions called per job, as locals (a global is two table lookups per use); the
-- globals exist only while a function runs: `entry` (registration) sets them
local call, format, find = nil, nil, nil
local OWNER = 'queasy_py' -- queasy_library returns OWNER .. ' ' .. VERSION: our marker
local TOMBSTONE_MS = 86400000
local MAX_MS = 253402300799999 -- 9999-12-31T23:59:59.999Z
local MAX_COUNT = 999999999999 -- events maxlen, batch limit, expiry window, pid
local MAX_ID_CHARS = 256
local MAX_TEXT = 65536 -- bytes of an error message, a traceback, a host name
local EVENT_TRACEBACK = 1024 -- bytes of a traceback an event keeps (its end)
local MAX_PAGE = 1000 -- jobs per call of queasy_jobs, queasy_requeue, queasy_purge
-- jobs per call of queasy_finish, queasy_retry, queasy_fail: each hands lists of up to two
-- values per job to one command (unpack), and Lua's stack holds 8000 (more failed the call
-- half-way: records ended, leases dropped, no end kept)
local MAX_ACKS = 1000
local MAX_DISPATCH = 1000 -- jobs per call of queasy_dispatch, queasy_dispatch_once (as above)
local MAX_DEQUEUE = 1000 -- jobs per call of queasy_dequeue (a larger limit takes this many)
local MAX_TRACE = 256 -- bytes of a job's trace context (a W3C traceparent is 55)
local ERROR_FIELDS = {'error_name', 'error_kind', 'error_message', 'traceback', 'error_at'}
local END_STATES = {finished = true, failed = true, cancelled = true}
local SCHEDULE_ID = 'schedule' -- the id of a schedule's occurrence (queasy_py defaults.py)
local MAX_SPEC = 200 -- bytes of a schedule's text

-- ---------------------------------------------------------------- checks (before any write)

-- Refuse the call: the reply is an error 'INVALID <what>' (queasy_py raises InvalidInput).
-- Every entry point checks all its arguments before its first write, so nothing is half-done.
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

-- `name` of an argument, of job `n` of a batch if given (built only for an error message).
local function label(name, n)
  if n == nil then
    return name
  end
  return 'job ' .. n .. ' ' .. name
end

-- A whole number written in decimal digits only, at most `max`; `name` names the argument.
local function whole(arg, name, max, n)
  if type(arg) ~= 'string' or #arg > 15 or string.find(arg, '^%d+$') == nil
      or tonumber(arg) > max then
    invalid(label(name, n) .. ' must be a whole number 0..' .. string.format('%d', max)
      .. ', got ' .. shown(arg))
  end
  return tonumber(arg)
end

-- A time: integer ms since the epoch, 0 ..= MAX_MS (year 9999). Fractions are refused.
local function ms(arg, name, n)
  return whole(arg, name .. ' (integer ms since the epoch)', MAX_MS, n)
end

-- A time for a retry: absolute ms since the epoch, or '+<ms>' from `now` (the server's clock,
-- so a supervisor with a skewed clock does not shift its backoffs), capped at MAX_MS.
local function run_at_from(arg, now, name, n)
  if type(arg) == 'string' and string.sub(arg, 1, 1) == '+' then
    return math.min(MAX_MS, now + whole(string.sub(arg, 2), name .. ' delay (+ms)', MAX_MS, n))
  end
  return ms(arg, name, n)
end

local function clock(arg)
  if arg ~= nil and arg ~= '' then
    return ms(arg, 'now')
  end
  local t = call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function flag(arg, name)
  if arg == '1' or arg == 'true' then
    return true
  elseif arg == '0' or arg == 'false' then
    return false
  end
  invalid(name .. " must be '1' or '0', got " .. shown(arg))
end

-- The id rules of queasy_py/validate.py, on bytes: 1-256 characters (UTF-8), no ASCII control
-- or space, no C1 control, no Unicode space (so newline-separated messages cannot be shifted).
-- Where `s` stops being well-formed UTF-8 (as Python's strict decoder reads it: no overlong
-- form, no surrogate, nothing past U+10FFFF): the index of the first byte of the first bad
-- sequence, or nil when it is all well-formed. Called for an id that is not printable ASCII.
local function utf8_bad(s)
  local byte, i, n = string.byte, 1, #s
  while i <= n do
    local c = byte(s, i)
    if c < 0x80 then
      i = i + 1
    else
      local len, lo, hi = nil, 0x80, 0xBF -- (lo, hi: the second byte's range)
      if c >= 0xC2 and c <= 0xDF then
        len = 2
      elseif c >= 0xE0 and c <= 0xEF then
        len = 3
        lo = c == 0xE0 and 0xA0 or 0x80
        hi = c == 0xED and 0x9F or 0xBF
      elseif c >= 0xF0 and c <= 0xF4 then
        len = 4
        lo = c == 0xF0 and 0x90 or 0x80
        hi = c == 0xF4 and 0x8F or 0xBF
      else
        return i
      end
      local c2 = byte(s, i + 1)
      if not c2 or c2 < lo or c2 > hi then
        return i
      end
      for k = i + 2, i + len - 1 do
        local ck = byte(s, k)
        if not ck or ck < 0x80 or ck > 0xBF then
          return i
        end
      end
      i = i + len
    end
  end
  return nil
end

local function check_id(arg, name, n)
  if type(arg) ~= 'string' or arg == '' or #arg > 4 * MAX_ID_CHARS then
    invalid(label(name, n) .. ' must be 1-256 characters, got ' .. shown(arg))
  end
  if string.find(arg, '[^!-~]') == nil then -- printable ASCII only: the usual id
    if #arg > MAX_ID_CHARS then
      invalid(label(name, n) .. ' must be 1-256 characters, got ' .. shown(arg))
    end
    return arg
  end
  local bad = utf8_bad(arg) -- (a supervisor could not read it: a job that never ran)
  if bad then -- (its bytes are not echoed: the error would not be UTF-8 either)
    invalid(label(name, n) .. ' is not UTF-8: byte ' .. bad .. ' is '
      .. string.format('0x%02x', string.byte(arg, bad)) .. ' (' .. #arg .. ' bytes)')
  end
  local chars = #arg - select(2, string.gsub(arg, '[\128-\191]', ''))
  if chars > MAX_ID_CHARS then
    invalid(label(name, n) .. ' must be 1-256 characters, got ' .. shown(arg))
  end
  if string.find(arg, '[%z\1-\32\127]') or string.find(arg, '\194[\128-\160]')
      or string.find(arg, '\225\154\128') or string.find(arg, '\226\128[\128-\138\168\169\175]')
      or string.find(arg, '\226\129\159') or string.find(arg, '\227\128\128') then
    invalid(label(name, n) .. ' contains whitespace or control characters: ' .. shown(arg))
  end
  return arg
end

-- JSON as the workers read it: cjson, made strict about numbers (no NaN, Infinity, hex) for
-- the checks in `check`, and lenient again (as other libraries may expect) afterwards.
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

-- Whether `v` may be a job's trace: a string of at most MAX_TRACE bytes of 0-9 a-f and '-' (a
-- W3C traceparent's characters; no newline, which would shift a push message's data).
local function trace_like(v)
  return type(v) == 'string' and #v <= MAX_TRACE and not string.find(v, '[^0-9a-f%-]')
end

-- A dispatch's trace argument, checked (trace_like), as it is.
local function check_trace(arg)
  if not trace_like(arg) then
    invalid('trace must be a W3C traceparent (0-9 a-f and -, at most ' .. MAX_TRACE
      .. ' bytes), got ' .. shown(arg))
  end
  return arg
end

-- Free text (an error message, a traceback, a host name): a string of at most MAX_TEXT bytes.
local function text(arg, name, n)
  if type(arg) ~= 'string' or #arg > MAX_TEXT then
    invalid(label(name, n) .. ' must be text of at most ' .. MAX_TEXT .. ' bytes, got '
      .. (type(arg) == 'string' and (#arg .. ' bytes') or 'nothing'))
  end
  return arg
end

-- A count bounded by MAX_PAGE, at least 1.
local function page(arg, name)
  local n = whole(arg, name, MAX_PAGE)
  if n < 1 then
    invalid(name .. ' must be 1..' .. MAX_PAGE .. ', got 0')
  end
  return n
end

local function groups(args, from, width, name)
  if (#args - from + 1) % width ~= 0 then
    invalid(name .. ': ARGV from ' .. from .. ' must come in groups of ' .. width .. ', got '
      .. (#args - from + 1) .. ' values')
  end
end

-- ---------------------------------------------------------------- helpers

-- A new list with room for 32 values: a table grown one value at a time is resized at each
-- power of two (5 times on its way to 16 values); `#` counts a list's values as usual.
local function list()
  return {nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
    nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil}
end

-- `cmd` [`key`] followed by the values of `items`, in calls of at most 1000 of them (an even
-- count: pairs stay whole) for a list of any length: Lua's stack holds 8000 values, and one
-- unpack() of a longer list fails the call half-way, after its earlier writes.
local function sliced(cmd, key, items)
  for s = 1, #items, 1000 do
    local e = math.min(s + 999, #items)
    if key then
      call(cmd, key, unpack(items, s, e))
    else
      call(cmd, unpack(items, s, e))
    end
  end
end

-- A read `cmd` (HMGET, ZMSCORE) of `key` for the members `ids`, any number of them, in
-- sliced's slices: its replies in the order of `ids`.
local function read_sliced(cmd, key, ids)
  if #ids <= 1000 then
    return call(cmd, key, unpack(ids))
  end
  local out = {}
  for s = 1, #ids, 1000 do
    local part = call(cmd, key, unpack(ids, s, math.min(s + 999, #ids)))
    for k = 1, math.min(1000, #ids - s + 1) do -- (a nil member of a reply: ipairs stops)
      out[s + k - 1] = part[k]
    end
  end
  return out
end

-- HMGET of the fields `ids` of hash `key`, any number of them.
local function hmget_sliced(key, ids)
  return read_sliced('HMGET', key, ids)
end

-- Every number written to Redis (hash fields, scores, stream fields, messages) is an integer
-- string: a Lua number would go as '%.14g' ('2.5340230079999e+14', '1e+20'). The last
-- number written is kept with its string: a batch writes the same run_at or now for each
-- job, one format for all.
local int_n, int_s = nil, nil
local function int(n)
  if n ~= int_n then
    int_n, int_s = n, format('%d', n)
  end
  return int_s
end

-- A whole number 1.. as int() writes it; those up to 1,000 are made once and kept (the
-- library's state lives as long as it is loaded): no format per lease of a dequeue.
local SMALL = {}
local function small(n)
  local s = SMALL[n]
  if s == nil then
    s = int(n)
    if n <= 1000 then
      SMALL[n] = s
    end
  end
  return s
end

-- A number field of a record as an integer in 0 ..= high; a field written around the library
-- (raw HSET: 'x', '1e+300', '-1', missing) reads as 0, so no function fails on it.
local function field_int(v, high)
  local n = tonumber(v)
  if n == nil or n ~= n or n < 0 or n > high then
    return 0
  end
  return math.floor(n)
end

-- ---------------------------------------------------------------- records (5.0 layout)
--[[ A living job's record (waiting, delayed or active: never renamed) is one field of the
hash B:rec: id -> "<run_at> <enqueued_at> <retry_count> <stall_count> <timeout_count>
<attempts>\t<trace>\t<data>". The six numbers are integer strings as the library writes
them (enqueued_at '-' when unknown: a record upgraded from a 4.x one without it); attempts
counts the leases before the current one (an active job's lease is not in it, as 4.x);
trace is '' or a traceparent (trace_like: no tab); data is last and may hold anything.
The numbers come first, in the order of a lease line of 4.1.0, which was "<token> " .. the
first five .. " <attempts + 1> <leased_at>" (5.1.0 writes "<token> <leased_at>": the ack
reads the record, ack_counts). ]]

-- The record string of the given parts (numbers as integer strings; trace '' for none).
local function rec_pack(run_at_s, enqueued_s, retry_s, stall_s, timeout_s, attempts_s, trace,
    data)
  return run_at_s .. ' ' .. enqueued_s .. ' ' .. retry_s .. ' ' .. stall_s .. ' ' .. timeout_s
    .. ' ' .. attempts_s .. '\t' .. trace .. '\t' .. data
end

-- A record string's three parts: its numbers ("<run_at> ... <attempts>"), its trace and its
-- data; nil for a value that is not a record (written around the library).
local function rec_parts(v)
  if not v then
    return nil
  end
  local t1 = find(v, '\t', 1, true)
  local t2 = t1 and find(v, '\t', t1 + 1, true)
  if not t2 then
    return nil
  end
  return string.sub(v, 1, t1 - 1), string.sub(v, t1 + 1, t2 - 1), string.sub(v, t2 + 1)
end

-- A record string as a job table, as 4.x's read_job gave it: {id, data, run_at,
-- retry_count, stall_count, timeout_count (numbers), attempts (an integer string), trace,
-- enqueued_at (digits, or false when unknown)}; nil for a value that is not a record. A
-- number garbled around the library reads as 0 (field_int), as 4.x read its fields.
local function rec_job(id, v)
  local nums, trace, data = rec_parts(v)
  if nums == nil then
    return nil
  end
  local r, e, rc, sc, tc, a = string.match(nums, '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+)$')
  if r == nil then
    r, e, rc, sc, tc, a = '0', '-', '0', '0', '0', '0'
  end
  return {
    id = id, data = data, run_at = field_int(r, MAX_MS), retry_count = field_int(rc, MAX_MS),
    stall_count = field_int(sc, MAX_MS), timeout_count = field_int(tc, MAX_MS),
    attempts = int(field_int(a, MAX_MS)), trace = trace,
    enqueued_at = (#e <= 15 and find(e, '^%d+$')) and e or false,
  }
end

-- The record string of a job table (rec_job's shape; enqueued_at false/nil: '-').
local function rec_of(job)
  return rec_pack(int(job.run_at), job.enqueued_at or '-', int(job.retry_count),
    int(job.stall_count), int(job.timeout_count), job.attempts or '0', job.trace or '',
    job.data or '')
end

-- Whether the string `v` is 1-15 decimal digits (a number as the library writes it). The
-- strings found so are kept (the library's state lives as long as it is loaded; emptied at
-- 1,024, a few dozen kilobytes): a value met again (a batch's run_at and enqueued_at, a
-- worker's pid) costs a table lookup, not a pattern match. A memo of a check on the string
-- alone: what is stored in Redis does not enter it.
local NUMERALS, numerals_n = {}, 0
local function numeral(v)
  if NUMERALS[v] then
    return true
  elseif #v > 15 or not find(v, '^%d+$') then
    return false
  end
  numerals_n = numerals_n + 1
  if numerals_n > 1024 then
    NUMERALS, numerals_n = {}, 1
  end
  NUMERALS[v] = true
  return true
end

-- A number field as the library writes it (1-15 decimal digits) as it is, else ''
-- (unknown): for fields only passed on, as the enqueued_at of an event. `v` is a field as
-- read (a string, or false/nil when missing).
local function digits(v)
  if v and #v <= 15 and find(v, '^%d+$') then
    return v
  end
  return ''
end

-- A number field as an integer string: as it is when the library wrote it, else as
-- field_int reads it (garbage is '0'); cheaper than a round trip through a number. `v` as
-- in digits; the usual count '0' costs a comparison (Lua strings are interned).
local function passed(v)
  if v == '0' or (v and numeral(v)) then
    return v
  elseif not v then
    return '0'
  end
  return int(field_int(v, MAX_MS))
end

-- The parts of a record string `v` that a lease takes, split with plain find()s (no
-- pattern: a 6-capture match costs ~8k instructions per job): its run_at, retry_count,
-- stall_count and timeout_count as integer strings (as passed() gives them), its trace and
-- data; nil for a value that is not a record (written around the library). Numbers garbled
-- around the library (not six words of digits, but enqueued_at, which a lease does not take)
-- read as rec_job reads them: 0. (rec_as_is tells its usual paths from the garbled one.)
local function rec_lease(v)
  local t1 = find(v, '\t', 1, true)
  local t2 = t1 and find(v, '\t', t1 + 1, true)
  if not t2 then
    return nil
  end
  local sub = string.sub
  local trace = t2 == t1 + 1 and '' or sub(v, t1 + 1, t2 - 1)
  local p1 = find(v, ' ', 1, true)
  -- the usual record (never failed, never leased): "<run_at> <enqueued_at> 0 0 0 0", told
  -- by one comparison of its end and one find
  if p1 and t1 > 9 and sub(v, t1 - 8, t1 - 1) == ' 0 0 0 0'
      and find(v, ' ', p1 + 1, true) == t1 - 8 then
    local run_at = sub(v, 1, p1 - 1)
    if numeral(run_at) then
      return run_at, '0', '0', '0', trace, sub(v, t2 + 1)
    end
  end
  local p2 = p1 and p1 < t1 and find(v, ' ', p1 + 1, true)
  local p3 = p2 and p2 < t1 and find(v, ' ', p2 + 1, true)
  local p4 = p3 and p3 < t1 and find(v, ' ', p3 + 1, true)
  local p5 = p4 and p4 < t1 and find(v, ' ', p4 + 1, true)
  if p5 and p5 < t1 then
    local run_at = sub(v, 1, p1 - 1)
    local retry, stall = sub(v, p2 + 1, p3 - 1), sub(v, p3 + 1, p4 - 1)
    local timeout, attempts = sub(v, p4 + 1, p5 - 1), sub(v, p5 + 1, t1 - 1)
    -- the usual record: numbers as the library writes them (counts '0': one comparison)
    if numeral(run_at) and (retry == '0' or numeral(retry)) and (stall == '0'
        or numeral(stall)) and (timeout == '0' or numeral(timeout))
        and (attempts == '0' or numeral(attempts)) then
      return run_at, retry, stall, timeout, trace, sub(v, t2 + 1)
    end
  end
  -- numbers garbled around the library: read as rec_job reads them
  local job = rec_job('', v)
  return int(job.run_at), int(job.retry_count), int(job.stall_count), int(job.timeout_count),
    job.trace, job.data
end

-- Whether the record string `v` is handed out as it is by queasy_dequeue's reply 'rec': true
-- when rec_lease reads it on a usual path (its numbers as the library writes them) and its
-- trace is at most MAX_TRACE bytes, false for another record (the caller builds it anew from
-- what rec_lease reads), nil for a value that is not a record. rec_lease's checks, without
-- the strings of its parts (no copy of the data).
local function rec_as_is(v)
  local t1 = find(v, '\t', 1, true)
  local t2 = t1 and find(v, '\t', t1 + 1, true)
  if not t2 then
    return nil
  elseif t2 - t1 > MAX_TRACE + 1 then
    return false
  end
  local sub = string.sub
  local p1 = find(v, ' ', 1, true)
  if not p1 or p1 > t1 or not numeral(sub(v, 1, p1 - 1)) then
    return false
  end
  -- the usual record (never failed, never leased): "<run_at> <enqueued_at> 0 0 0 0"
  if t1 > 9 and sub(v, t1 - 8, t1 - 1) == ' 0 0 0 0'
      and find(v, ' ', p1 + 1, true) == t1 - 8 then
    return true
  end
  local p2 = find(v, ' ', p1 + 1, true)
  local p3 = p2 and p2 < t1 and find(v, ' ', p2 + 1, true)
  local p4 = p3 and p3 < t1 and find(v, ' ', p3 + 1, true)
  local p5 = p4 and p4 < t1 and find(v, ' ', p4 + 1, true)
  if not p5 or p5 > t1 then
    return false
  end
  local retry, stall = sub(v, p2 + 1, p3 - 1), sub(v, p3 + 1, p4 - 1)
  local timeout, attempts = sub(v, p4 + 1, p5 - 1), sub(v, p5 + 1, t1 - 1)
  return (retry == '0' or numeral(retry)) and (stall == '0' or numeral(stall))
    and (timeout == '0' or numeral(timeout)) and (attempts == '0' or numeral(attempts))
end

-- The numbers of the active record `v` that its ack's event and end repeat: `counts`, its
-- first five numbers as stored
-- ("<run_at> <enqueued_at> <retry_count> <stall_count> <timeout_count>") and `attempts`
-- counting its lease (the record's + 1), when they are what library 4.1.0's lease held for
-- it (lease_line) and lease_of took: every number 1-15 digits, enqueued_at known. Else nil:
-- the caller reads the record as rec_job does (leased(): a record upgraded without
-- enqueued_at, numbers garbled around the library), so the event and the end are byte for
-- byte those of 5.0.0, whose lease held these numbers. The usual record is told by one
-- anchored match of position captures only (no string made: ~2.5k instructions per job less
-- in finish than rec_lease's plain find()s and numeral()s of its two numbers, measured with
-- benchmarks/layout5/cost.py --callgrind), any other by plain find()s (as rec_lease); no
-- 6-capture match.
local function ack_counts(v)
  -- the usual record (never failed, never leased): "<run_at> <enqueued_at> 0 0 0 0\t..."
  local p1, p = string.match(v, '^%d+() %d+ 0 0 0() 0\t[^\t]*\t')
  if p1 then
    if p1 > 16 or p - 7 - p1 > 15 then
      return nil
    end
    return string.sub(v, 1, p - 1), '1'
  end
  local t1 = find(v, '\t', 1, true)
  if not t1 or not find(v, '\t', t1 + 1, true) then
    return nil
  end
  local sub = string.sub
  local p1 = find(v, ' ', 1, true)
  if not p1 or p1 > 16 or not numeral(sub(v, 1, p1 - 1)) then
    return nil
  end
  local p2 = find(v, ' ', p1 + 1, true)
  if not p2 or p2 > t1 or not numeral(sub(v, p1 + 1, p2 - 1)) then
    return nil
  end
  local p3 = find(v, ' ', p2 + 1, true)
  local p4 = p3 and p3 < t1 and find(v, ' ', p3 + 1, true)
  local p5 = p4 and p4 < t1 and find(v, ' ', p4 + 1, true)
  if not p5 or p5 > t1 then
    return nil
  end
  local retry, stall = sub(v, p2 + 1, p3 - 1), sub(v, p3 + 1, p4 - 1)
  local timeout, attempts = sub(v, p4 + 1, p5 - 1), sub(v, p5 + 1, t1 - 1)
  if (retry == '0' or numeral(retry)) and (stall == '0' or numeral(stall))
      and (timeout == '0' or numeral(timeout)) and (attempts == '0' or numeral(attempts)) then
    attempts = attempts == '0' and '1' or int(tonumber(attempts) + 1)
    if #attempts <= 15 then
      return sub(v, 1, p5 - 1), attempts
    end
  end
  return nil
end

-- A job blocked behind the active one with its id, as B:blocked holds it: "<u_data>
-- <u_reset> <u_run_at> <u_lo> <u_hi>\t<record string>", the composed update flags of its
-- dispatches (see run_at_update: u_data, u_reset '1'|'0'; u_run_at 'replace'|'clamp'; u_lo,
-- u_hi digits or '-' for no bound) and its own record.
local function blocked_pack(u_data, u_reset, kind, lo, hi, record)
  return (u_data and '1' or '0') .. ' ' .. (u_reset and '1' or '0') .. ' ' .. kind .. ' '
    .. (lo and int(lo) or '-') .. ' ' .. (hi and int(hi) or '-') .. '\t' .. record
end

-- A value of B:blocked as {u_data, u_reset (booleans), u_run_at, u_lo, u_hi (strings as
-- stored: run_at_update reads them)} and its record string; nil for a value whose record is
-- not one (written around the library). Flags garbled around the library read as none
-- ('0', 'keep', no bound: as 4.x read garbage u_* fields).
local function blocked_parts(v)
  local t = v and find(v, '\t', 1, true)
  if not t then
    return nil
  end
  local record = string.sub(v, t + 1)
  if rec_parts(record) == nil then
    return nil
  end
  local ud, ur, kind, lo, hi = string.match(string.sub(v, 1, t - 1),
    '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
  return {u_data = ud == '1', u_reset = ur == '1', u_run_at = kind or 'keep', u_lo = lo or '-',
    u_hi = hi or '-'}, record
end

-- The value of a lease in B:lease:<client>: "<token> <leased_at>" (the form of 4.0.0, written
-- again since 5.1.0; dequeue writes it inline). Library 4.1.0 to 5.0.0 wrote "<token> <run_at>
-- <enqueued_at> <retry_count> <stall_count> <timeout_count> <attempts> <leased_at>", the
-- numbers of the record it leased, so that an ack read them there (lease_of, kept for those
-- leases); since every living record is a field of B:rec, which the ack reads anyway, an ack
-- takes them from the record (ack_counts) and the lease holds the token and its time only.
-- Every reader takes both forms (holds, leased_at, the readers, sweep_one, handback).
local function lease_line(token, now_s)
  return token .. ' ' .. now_s
end

-- The error of an attempt that failed: {name, kind, message, traceback} (strings), or nil.
-- It becomes the job's last error, at `now`: the value of B:err for its id (5.0), the JSON
-- {name, kind, message, traceback, at} (`at` an integer string). The caller writes it
-- (write_errors: one HSET per call).
local function write_error(errs, id, err, now)
  errs[#errs + 1] = id
  errs[#errs + 1] = cjson.encode({name = err.name, kind = err.kind, message = err.message,
    traceback = err.traceback, at = int(now)})
end

local function write_errors(B, errs)
  if #errs > 0 then
    call('HSET', B .. ':err', unpack(errs))
  end
end

-- The fields of 4.x's last error (B:ended:<id> keeps them so) and their names in B:err.
local ERROR_NAMES = {{'error_name', 'name'}, {'error_kind', 'kind'},
  {'error_message', 'message'}, {'traceback', 'traceback'}, {'error_at', 'at'}}

-- The hash B:ended:<id> of a record kept whole, as {field, value, ...} for one HSET: the
-- fields library 4.x's record hash held, in its order, built from the record string `v`
-- (id, data, run_at, enqueued_at when known, trace when there is one, and the counts and
-- attempts once the job was requeued: 4.x wrote them then, and left them absent while 0
-- before), the last error `errv` (B:err's JSON, or false: error_name, error_kind,
-- error_message, traceback, error_at), then the `extra` pairs (a later pair of a field
-- replaces its value in place, as 4.x's HSET on the renamed record did). A value garbled
-- around the library (not a record, not JSON) gives only the fields it can.
local function ended_fields(id, v, errv, extra)
  local out = {'id', id}
  local job = rec_job(id, v)
  if job ~= nil then
    out[3], out[4], out[5], out[6] = 'data', job.data, 'run_at', int(job.run_at)
    if job.enqueued_at then
      out[#out + 1], out[#out + 2] = 'enqueued_at', job.enqueued_at
    end
    if job.trace ~= '' then
      out[#out + 1], out[#out + 2] = 'trace', job.trace
    end
    if job.attempts ~= '0' or job.retry_count ~= 0 or job.stall_count ~= 0
        or job.timeout_count ~= 0 then
      local n = #out
      out[n + 1], out[n + 2] = 'retry_count', int(job.retry_count)
      out[n + 3], out[n + 4] = 'stall_count', int(job.stall_count)
      out[n + 5], out[n + 6] = 'timeout_count', int(job.timeout_count)
      out[n + 7], out[n + 8] = 'attempts', job.attempts
    end
  end
  if errv then
    local ok, e = pcall(cjson.decode, errv)
    if ok and type(e) == 'table' then
      for _, f in ipairs(ERROR_NAMES) do
        local x = e[f[2]]
        if type(x) == 'number' then
          x = int(x)
        end
        if type(x) == 'string' then
          out[#out + 1], out[#out + 2] = f[1], x
        end
      end
    end
  end
  if extra ~= nil then
    for k = 1, #extra do
      out[#out + 1] = extra[k]
    end
  end
  return out
end

local RUN_AT_MODES = {replace = true, keep = true, if_later = true, if_earlier = true}

-- mode: 'replace' | 'keep' | 'if_later' | 'if_earlier'
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

--[[ The run_at updates of a blocked job, applied when the active job is requeued at time R:
the composition of its dispatches' merges, so they act exactly as they would, one by one,
on a waiting job at R. Each merge is R -> const (replace), R (keep), max(R, r) (if_later),
min(R, r) (if_earlier); composed they are either a constant (u_run_at 'replace': the
blocked record's own run_at, merged one by one) or a clamp of R into [u_lo, u_hi]
(u_run_at 'clamp', '' for no bound). A record of library 1.1 holds a plain mode instead,
whose bound is the record's run_at. ]]
local function run_at_update(u_run_at, u_lo, u_hi, record_run_at)
  if u_run_at == 'replace' then
    return 'replace'
  elseif u_run_at == 'if_later' then
    return 'clamp', record_run_at, nil
  elseif u_run_at == 'if_earlier' then
    return 'clamp', nil, record_run_at
  elseif u_run_at == 'clamp' then
    return 'clamp', tonumber(u_lo), tonumber(u_hi) -- tonumber('') is nil: no bound
  end
  return 'clamp', nil, nil -- 'keep'
end

local function then_merge(kind, lo, hi, mode, r)
  if kind == 'replace' or mode == 'replace' then
    return 'replace'
  elseif mode == 'if_later' then
    return kind, math.max(lo or r, r), hi and math.max(hi, r)
  elseif mode == 'if_earlier' then
    return kind, lo and math.min(lo, r), math.min(hi or r, r)
  end
  return kind, lo, hi
end

local function apply_update(kind, lo, hi, record_run_at, requeue_at)
  if kind == 'replace' then
    return record_run_at
  end
  if lo ~= nil and requeue_at < lo then
    requeue_at = lo
  end
  if hi ~= nil and requeue_at > hi then
    requeue_at = hi
  end
  return requeue_at
end

-- The last `limit` bytes of `s`, not starting inside a UTF-8 sequence.
local function tail(s, limit)
  if #s <= limit then
    return s
  end
  local from = #s - limit + 1
  while from <= #s and string.find(string.sub(s, from, from), '[\128-\191]') do
    from = from + 1
  end
  return string.sub(s, from)
end

-- A value of an event line or an end line: '-' for '' (unknown).
local function known(v)
  if v == '' then
    return '-'
  end
  return v
end

-- The event of an outcome of `job` at `now` (ms, a string), appended to B:events unless
-- `maxlen` is 0: one field `event`, the line "<outcome> <id> <ended_at> <started_at> <pid>
-- <run_at> <enqueued_at> <retry_count> <stall_count> <timeout_count> <client>" ('-' for a
-- value unknown), and with an error (any of its texts not ''): error_name, error_kind,
-- error_message, traceback (its last EVENT_TRACEBACK bytes). Returns the parts of the line
-- that the job's end repeats (ending): "<ended_at> <started_at> <pid>" and "<run_at> ...
-- <client>". `job.client` is the client that held it ('' for a job that was not active);
-- `job.enqueued_at` its field as stored (passed on through digits). `pid` and `started_at`
-- are strings ('' or checked digits); `err` as in write_error, or nil.
local function outcome_event(B, maxlen, now, outcome, job, pid, started_at, err)
  local at = now .. ' ' .. known(started_at) .. ' ' .. known(pid)
  local counts = (job.run_at_s or int(job.run_at)) .. ' ' .. known(digits(job.enqueued_at))
    .. ' ' .. (job.retry_s or int(job.retry_count)) .. ' ' .. (job.stall_s
    or int(job.stall_count)) .. ' ' .. (job.timeout_s or int(job.timeout_count)) .. ' '
    .. known(job.client or '')
  if maxlen > 0 then
    local line = outcome .. ' ' .. job.id .. ' ' .. at .. ' ' .. counts
    if err == nil or (err.name == '' and err.kind == '' and err.message == ''
        and err.traceback == '') then
      call('XADD', B .. ':events', 'MAXLEN', '~', maxlen, '*', 'event', line)
    else
      local trace = err.traceback
      if #trace > EVENT_TRACEBACK then
        trace = tail(trace, EVENT_TRACEBACK)
      end
      call('XADD', B .. ':events', 'MAXLEN', '~', maxlen, '*', 'event', line,
        'error_name', err.name, 'error_kind', err.kind, 'error_message', err.message,
        'traceback', trace)
    end
  end
  return at, counts
end

-- Put `job` (leaving the active state; from leased(): its numbers, `attempts` counting this
-- lease, `v` its record string) back in waiting at run_at, merging the update of the blocked
-- job with its id, if any (`bv`: its value in B:blocked, or false), so one job with that id
-- remains. Its record keeps what it gathered (enqueued_at, trace, the last error in B:err);
-- `err` (or nil) becomes its last error, at `now`. The writes go into `out` ({recs, scored,
-- errs, unblocked}: requeued() writes them, one command each per call).
local function requeue(job, run_at, err, now, bv, out)
  local id = job.id
  local data = job.data
  if bv then
    local u, brec = blocked_parts(bv)
    local b = brec and rec_job(id, brec)
    if b ~= nil then
      if u.u_data then
        data = b.data -- else its data stays as it is in the record
      end
      local kind, lo_n, hi_n = run_at_update(u.u_run_at, u.u_lo, u.u_hi, b.run_at)
      run_at = apply_update(kind, lo_n, hi_n, b.run_at, run_at)
      if u.u_reset then
        job.retry_count, job.stall_count, job.timeout_count = 0, 0, 0
      end
    end
    out.unblocked[#out.unblocked + 1] = id -- (a value that is not one is dropped: no job)
  end
  job.run_at = run_at
  local recs, scored, run_at_s = out.recs, out.scored, int(run_at)
  recs[#recs + 1] = id
  recs[#recs + 1] = rec_pack(run_at_s, job.enqueued_at or '-', int(job.retry_count),
    int(job.stall_count), int(job.timeout_count), job.attempts, job.trace, data)
  scored[#scored + 1] = run_at_s
  scored[#scored + 1] = id
  if err ~= nil then
    write_error(out.errs, id, err, now)
  end
end

local function requeue_batch()
  return {recs = list(), scored = list(), errs = list(), unblocked = list()}
end

-- Write the requeues gathered in `out` (requeue): the records, B:waiting, the last errors,
-- and the blocked jobs merged; in slices (sliced): a sweep requeues every lease of its client,
-- thousands of them maybe (one unpack() of over 8,000 values failed the call half-way,
-- after the jobs' 'stalled' events: the next call swept them again).
local function requeued(B, out)
  sliced('HSET', B .. ':rec', out.recs)
  sliced('ZADD', B .. ':waiting', out.scored)
  sliced('HSET', B .. ':err', out.errs)
  sliced('HDEL', B .. ':blocked', out.unblocked)
end

-- The state of an end (its first word, see B:ends), or nil.
local function end_state(v)
  local state = v and string.match(v, '^(%a+)')
  return END_STATES[state] and state or nil
end

-- An end in `state`, as B:ends holds it, from the parts of its event line (outcome_event:
-- `at`, `counts`) and the job's `attempts` (an integer string): "<state> <ended_at> <started_at>
-- <pid> <attempts> <run_at> <enqueued_at> <retry_count> <stall_count> <timeout_count>
-- <client> <host>" (a value unknown: '-'; the host last: it may hold spaces).
local function ending(state, at, counts, attempts, host)
  return state .. ' ' .. at .. ' ' .. attempts .. ' ' .. counts .. ' ' .. host
end
local END_FIELDS = {'state', 'ended_at', 'started_at', 'pid', 'attempts', 'run_at',
  'enqueued_at', 'retry_count', 'stall_count', 'timeout_count', 'client', 'host'}

-- Job `id` ends. Kept whole (`fields`, from ended_fields: a failure, a cancel, a result, a
-- job with an earlier failed attempt) its record becomes B:ended:<id>; else (`fields` nil)
-- its end alone (in B:ends) is what is kept of it. A record of an earlier end of that id is
-- replaced or dropped; its id may stay in the index of another state (readers go by
-- B:ends). `keep` false (a retention of 0): nothing is kept. The caller writes the end into
-- B:ends and the id into B:<state> (once per call: retain), and drops the living record
-- from B:rec and its last error from B:err (drop_living: one HDEL each per call). `out`
-- gathers the records kept whole (`whole`: write_ended, one DEL per call for the earlier
-- ones, then one HSET each), the keys to delete (`gone`: one DEL per call, the caller's;
-- nothing reads them before it) and the ids whose end goes from B:ends (`unended`).
local function end_record(B, id, keep, fields, out)
  local ekey = B .. ':ended:' .. id
  if keep and fields ~= nil then
    out.whole[#out.whole + 1] = ekey
    out.whole[#out.whole + 1] = fields
    return
  end
  out.gone[#out.gone + 1] = ekey
  if not keep then
    out.unended[#out.unended + 1] = id
  end
end

local function ends_batch()
  return {whole = {}, gone = list(), unended = {}} -- (the usual call fills `gone` only)
end

-- Write the records kept whole gathered by end_record: the earlier records of their ids go
-- first, in one DEL.
local function write_ended(out)
  local whole = out.whole
  if #whole > 0 then
    local keys = {}
    for k = 1, #whole, 2 do
      keys[#keys + 1] = whole[k]
    end
    call('DEL', unpack(keys))
    for k = 1, #whole, 2 do
      call('HSET', whole[k], unpack(whole[k + 1]))
    end
  end
end

-- Drop the ends of the ids gathered by end_record (a retention of 0).
local function unended(B, out)
  if #out.unended > 0 then
    call('HDEL', B .. ':ends', unpack(out.unended))
  end
end

-- The living records of the jobs `ids` that ended leave B:rec, and their last errors B:err
-- (those of `erred` when given: the ids that may have one): one HDEL each per call.
local function drop_living(B, ids, erred)
  erred = erred or ids
  if #ids > 0 then
    call('HDEL', B .. ':rec', unpack(ids))
  end
  if #erred > 0 then
    call('HDEL', B .. ':err', unpack(erred))
  end
end

-- Drop `ids` (the first of the index of `state`, about to be removed from it) with their
-- records and ends: those whose end (B:ends) is of another state are only unindexed.
-- `dels`, if given, collects the records' keys for the caller's one DEL (as end_record's
-- `gone`), else they go now. Returns how many ends were dropped (the others: unindexed only).
local function drop_ends(B, state, ids, dels)
  if #ids == 0 then
    return 0
  end
  local ends = call('HMGET', B .. ':ends', unpack(ids))
  local gone, records = {}, dels or {}
  for i, id in ipairs(ids) do
    if end_state(ends[i]) == state then
      gone[#gone + 1] = id
      records[#records + 1] = B .. ':ended:' .. id
    end
  end
  if #gone > 0 then
    if dels == nil then
      call('DEL', unpack(records))
    end
    call('HDEL', B .. ':ends', unpack(gone))
  end
  return #gone
end

-- Drop the oldest entries of B:<state> beyond the newest `count` and those that ended
-- before now - age_ms: at most `budget` per call (a call that ended n jobs passes n + 2, so
-- the records shrink back when the retention is lowered).
local function trim(B, state, now, count, age_ms, budget, dels)
  local zkey = B .. ':' .. state
  local n = math.max(call('ZCARD', zkey) - count,
    call('ZCOUNT', zkey, '-inf', '(' .. int(now - age_ms)))
  n = math.min(n, budget)
  if n > 0 then
    drop_ends(B, state, call('ZRANGE', zkey, 0, n - 1), dels)
    call('ZREMRANGEBYRANK', zkey, 0, n - 1)
  end
end

-- Keep the ends of this call's ended jobs (`scored`: {ended_at, id, ...}, `ends`: {id,
-- end, ...}) and trim (`dels`: as drop_ends).
local function retain(B, state, now, keep_count, keep_ms, scored, ends, dels)
  if #scored > 0 and keep_count > 0 and keep_ms > 0 then
    call('ZADD', B .. ':' .. state, unpack(scored))
    call('HSET', B .. ':ends', unpack(ends))
  end
  trim(B, state, now, keep_count, keep_ms, #scored / 2 + 2, dels)
end

-- Count `n` jobs that ended in `state` ('finished'|'failed') at `now`: the total since a
-- reset and this minute's count. A minute's first count drops the buckets older than an hour.
local function tally(B, state, now, n)
  if n == 0 then
    return
  end
  local skey = B .. ':stats'
  local minute = math.floor(now / 60000)
  local bucket = state .. ':' .. int(minute)
  local v = call('HMGET', skey, state, bucket)
  local fresh = field_int(v[2], MAX_MS) == 0
  call('HSET', skey, state, int(field_int(v[1], MAX_MS) + n),
    bucket, int(field_int(v[2], MAX_MS) + n))
  if fresh then
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

-- The active job `id` has ended: promote a blocked job with its id, if any: its record (in
-- B:blocked, see blocked_pack) becomes the waiting record of `id` in B:rec, at its run_at.
-- `any_blocked` false (B:blocked is empty) saves a lookup. Returns true when a job was
-- promoted: its record is in B:rec now, so the caller drops the ended record from B:rec
-- BEFORE it calls promote (or leaves this id out of a later HDEL). A value of B:blocked
-- whose record is not one (written around the library) is dropped.
local function promote(B, id, any_blocked)
  if not any_blocked then
    return false
  end
  local bkey = B .. ':blocked'
  local v = call('HGET', bkey, id)
  if not v then
    return false
  end
  call('HDEL', bkey, id)
  local _, record = blocked_parts(v)
  if record == nil then
    return false
  end
  -- (its run_at, the record's first number: a garbled one reads as 0, as 4.x's field_int)
  local run_at = int(field_int(string.match(record, '^[^ \t]*'), MAX_MS))
  call('HSET', B .. ':rec', id, record)
  call('ZADD', B .. ':waiting', run_at, id)
  call('SPUBLISH', B .. ':wake', run_at)
  return true
end

-- Whether `held`, a value of B:lease:<client> ("<token> ... <leased_at>": lease_line; a
-- lease taken by library 3.x: "<token>"), or false, is the lease `token` (a token holds no
-- space).
local function holds(held, token)
  if not held or find(token, ' ', 1, true) then
    return false
  elseif #held == #token then -- a lease of 3.x
    return held == token
  end
  return find(held, token, 1, true) == 1 and string.byte(held, #token + 1) == 32
end

-- Check the lease of `client` on `id`: `held` is its value in B:lease:<client> (or false; a
-- swept client's leases are gone), `v` its record in B:rec (or false). Returns the active
-- job (rec_job's table: its numbers, data, trace, enqueued_at; `attempts` counting this
-- lease; `client`, `held`) or nil when stale (no lease, another token, no record). The
-- caller drops the lease from B:lease:<client> (each_leased: one HDEL per call). A record
-- garbled around the library (not a record string) reads as one of numbers 0, no data.
-- (A lease of 3.x, the token alone, is read as one of 4.0.0: the upgrade to 5.0 made its
-- record's attempts not count it.)
local function leased(client, id, token, held, v)
  if not v or not holds(held, token) then
    return nil
  end
  local job = rec_job(id, v) or rec_job(id, '0 - 0 0 0 0\t\t')
  job.attempts = int(tonumber(job.attempts) + 1)
  job.client, job.held = client, held
  return job
end

-- The lease `held` of `client` on `id` when it is `token`'s and as library 4.1.0 to 5.0.0
-- wrote it: the active job with the numbers the lease holds (`counts`: "<run_at>
-- <enqueued_at> <retry_count> <stall_count> <timeout_count>", as an event line has them;
-- `attempts` counting this lease), without reading its record. Else nil: the caller reads
-- the record (leased(): a lease of 4.0.0 or 3.x, one garbled around the library, a stale
-- token). The caller checks that the active record exists (each_leased: one HMGET of B:rec
-- per call).
local function lease_of(client, id, token, held)
  if not held or string.byte(held, #token + 1) ~= 32 or find(held, token, 1, true) ~= 1 then
    return nil
  end
  -- (its leased_at, last, is read where it is needed: leased_at())
  -- (a, b, c, d: where the first four numbers end; position captures make no string)
  local s = #token + 2
  local counts, a, b, c, d, attempts = string.match(held,
    '^(%d+() %d+() %d+() %d+() %d+) (%d+) ', s)
  -- a number longer than the library writes (15 digits: MAX_MS), garbled around it, would go
  -- into the event and the end as it is (a reader's float of it overflows): the record's
  -- numbers are read instead (leased(): rec_job reads such a number as 0)
  if counts == nil or a - s > 15 or b - a > 16 or c - b > 16 or d - c > 16
      or s + #counts - d > 16 or #attempts > 15 then
    return nil
  end
  return {id = id, client = client, held = held, counts = counts, attempts = attempts}
end

-- When the lease of `job` (from leased() or lease_of()) was taken (ms, as written).
local function leased_at(job)
  -- a value garbled around the library ('<token> 1\t2': no match) is '' (reads as 0)
  return string.match(job.held, ' (%S*)$') or ''
end

-- The loop of finish, retry and fail: for each group of `width` ARGV from index `from` (id
-- and token first), `act(job, i)` runs on the job when `client` still holds its lease (when
-- `usable(i)` is true, if given; else the lease is left alone) and its record is in B:rec
-- (one HMGET per call of the ids whose lease holds: `job.v` is the record string). The
-- leases are checked first, then acted on in order. With `quick` (finish), the job's numbers
-- come as `counts` and `attempts` (the event line's and the end's, as 4.1.0's lease held
-- them): from a lease of 4.1.0 (lease_of: written by 5.0.0), else from the record split with
-- plain find()s (ack_counts: a lease of 5.1.0, "<token> <leased_at>"), else (a record
-- upgraded without enqueued_at, or garbled around the library) leased(). The leases
-- taken leave B:lease:<client> in one HDEL after the loop; an id acked twice in one call is
-- stale the second time (its record leaves B:rec only at the end of the call). Returns one
-- code per job (0 ok, 1 stale) and the ids acted on.
local function each_leased(B, client, args, from, width, act, usable, quick)
  local codes, taken, seen, ids = list(), list(), {}, list()
  local lkey = B .. ':lease:' .. client
  for i = from, #args, width do
    ids[#ids + 1] = args[i]
  end
  local held = #ids > 0 and call('HMGET', lkey, unpack(ids)) or {}
  local cands, at, jobs = list(), list(), list()
  for k, id in ipairs(ids) do
    local i = from + (k - 1) * width
    if (usable == nil or usable(i)) and not seen[id] then
      local token, h, job, short = args[i + 1], held[k], nil, false
      if quick and h then
        -- the lease is `token`'s when its first space follows the token (holds(); the token
        -- holds no space then); 5.1.0's form has no other, 4.1.0's has six more
        local p = find(h, ' ', 1, true)
        if p == #token + 1 and find(h, token, 1, true) == 1 then
          if find(h, ' ', p + 1, true) then
            job = lease_of(client, id, token, h) -- (nil: garbled, read as 4.0.0's below)
          else
            short = true
          end
        end
      end
      if job or short or holds(h, token) then
        seen[id] = true
        cands[#cands + 1] = id
        at[#cands] = k
        -- (a token: the job is read from its record below; true: 5.1.0's lease, ack_counts)
        jobs[k] = job or short or token
      end
    end
  end
  if #cands > 0 then
    local recs = call('HMGET', B .. ':rec', unpack(cands))
    for c, id in ipairs(cands) do
      local k, v = at[c], recs[c]
      local job = jobs[k]
      if not v then -- no record (written around the library): stale
        jobs[k] = nil
      elseif type(job) == 'table' then
        job.v = v
      else
        local counts, attempts = nil, nil
        if job == true then
          counts, attempts = ack_counts(v)
        end
        if counts then
          job = {id = id, client = client, held = held[k], counts = counts, attempts = attempts,
            v = v}
        else
          job = leased(client, id, args[from + (k - 1) * width + 1], held[k], v)
          job.v = v
        end
        jobs[k] = job
      end
    end
  end
  for k, id in ipairs(ids) do
    local job = jobs[k]
    if job == nil then
      codes[k] = 1
    else
      taken[#taken + 1] = id
      act(job, from + (k - 1) * width)
      codes[k] = 0
    end
  end
  if #taken > 0 then
    call('HDEL', lkey, unpack(taken))
  end
  return codes, taken
end

-- Check the ack ARGV shared by finish, retry and fail: client, maxlen, whole groups of
-- `width` from index `from` (at most MAX_ACKS), and a worker pid and started_at ('' or
-- digits) at offsets `pid_at`, `pid_at + 1` of each group.
local function check_acks(args, from, width, pid_at, name)
  check_id(args[2], 'client id')
  local maxlen = whole(args[3], 'events maxlen', MAX_COUNT)
  groups(args, from, width, name)
  if (#args - from + 1) / width > MAX_ACKS then
    invalid(name .. ': at most ' .. MAX_ACKS .. ' jobs per call, got ' .. (#args - from + 1)
      / width)
  end
  for i = from, #args, width do
    local pid, started = args[i + pid_at], args[i + pid_at + 1]
    -- the usual pid (<= 7 digits) and started_at (13 digits) pass on one find each
    if pid ~= '' and not (pid and #pid <= 7 and numeral(pid)) then
      whole(pid, 'worker pid', MAX_COUNT)
    end
    if started ~= '' and not (started and #started <= 14 and find(started, '^%d+$')) then
      ms(started, 'started_at')
    end
  end
  return args[2], maxlen
end

-- Check the ARGV 4-7 of finish and fail (how their records are kept) and return them as
-- {count, ms, host, notify}.
local function check_ends(args)
  return {
    count = whole(args[4], 'keep count', MAX_COUNT),
    ms = whole(args[5], 'keep ms', MAX_MS),
    host = text(args[6], 'host'),
    notify = flag(args[7], 'notify'),
  }
end

-- The error of a group: name, message and traceback at ARGV i, i + 1, i + 2 (checked).
local function check_error(args, i, n)
  text(args[i], 'error name', n)
  text(args[i + 1], 'error message', n)
  text(args[i + 2], 'traceback', n)
end

-- ---------------------------------------------------------------- upgrade of 4.x data (5.0)
--[[ A queue's keys written by library 4.x (B:job:<id>, B:active:<id>, the set B:blocked,
the error fields of a record, leases of 3.x/4.0.0) are converted into the 5.0 layout by the
first write calls on B after this library is loaded (entry: layout_of), UPGRADE_BUDGET
records per call, in order: the records of B:waiting (from the rank kept in B:upgrade's
field `waiting`), the set B:blocked (read whole: it becomes the hash), then the active
records of the leases of each client of B:expiry (B:upgrade's `client`: the clients done).
Every write call is refused (TRYAGAIN, nothing else done) until the last record is
converted: then B:layout is set to '5' and B:upgrade goes. Converting is idempotent: a 4.x
key converted is deleted in the same call, and one already gone is skipped. ]]

local UPGRADE_BUDGET = 500 -- 4.x records converted per call

-- The hash `key` as a table field -> value, or nil when it does not exist.
local function hash_of(key)
  local flat = redis.pcall('HGETALL', key)
  if flat.err or #flat == 0 then -- (not a hash, written around the library: no record)
    return nil
  end
  local t = {}
  for i = 1, #flat, 2 do
    t[flat[i]] = flat[i + 1]
  end
  return t
end

-- The 5.0 parts of a 4.x record `f` (hash_of): its record string, its last error as B:err
-- holds it (or nil), and the numbers a lease of 4.1.0 repeats: "<run_at> <enqueued_at>
-- <retry_count> <stall_count> <timeout_count>" (nil when it has no enqueued_at: its lease
-- stays "<token> <leased_at>") and its attempts before the current lease. `legacy`: an
-- active record of 3.x, whose attempts count its lease. A number garbled around the library
-- reads as 0 (as 4.x read it); a trace with a tab (not one: written around it) is dropped.
local function upgraded(f, legacy)
  local attempts = field_int(f.attempts, MAX_MS)
  if legacy and attempts > 0 then
    attempts = attempts - 1
  end
  local trace = f.trace or ''
  if find(trace, '\t', 1, true) then
    trace = ''
  end
  local enqueued = digits(f.enqueued_at)
  local run_at, retry = passed(f.run_at), passed(f.retry_count)
  local stall, timeout = passed(f.stall_count), passed(f.timeout_count)
  local v = rec_pack(run_at, enqueued == '' and '-' or enqueued, retry, stall, timeout,
    int(attempts), trace, f.data or '')
  local err = nil
  if f.error_name or f.error_kind or f.error_message or f.traceback or f.error_at then
    err = cjson.encode({name = f.error_name or '', kind = f.error_kind or '',
      message = f.error_message or '', traceback = f.traceback or '',
      at = int(field_int(f.error_at, MAX_MS))})
  end
  local numbers_ = nil
  if enqueued ~= '' then
    numbers_ = run_at .. ' ' .. enqueued .. ' ' .. retry .. ' ' .. stall .. ' ' .. timeout
  end
  return v, err, numbers_, attempts
end

-- A 4.x bound of a blocked job's run_at update ('' or missing: none) as 5.0 writes it.
local function bound(v)
  local n = tonumber(v)
  if n == nil or n ~= n or n < 0 or n > MAX_MS then
    return '-'
  end
  return int(math.floor(n))
end

-- The value of B:blocked (5.0) for the blocked 4.x record `f` with record string `v`: its
-- update fields composed as 4.4.0 applies them (a plain mode of 1.1, 'if_later' or
-- 'if_earlier', is a clamp at the record's run_at; 'keep' or none, a clamp without bounds).
local function blocked_value(f, v)
  local mode, lo, hi = f.u_run_at, '-', '-'
  if mode == 'replace' then
    mode = 'replace'
  elseif mode == 'if_later' then
    mode, lo = 'clamp', passed(f.run_at)
  elseif mode == 'if_earlier' then
    mode, hi = 'clamp', passed(f.run_at)
  elseif mode == 'clamp' then
    lo, hi = bound(f.u_lo), bound(f.u_hi)
  else
    mode = 'clamp'
  end
  return (f.u_data == '1' and '1' or '0') .. ' ' .. (f.u_reset == '1' and '1' or '0') .. ' '
    .. mode .. ' ' .. lo .. ' ' .. hi .. '\t' .. v
end

-- Convert the 4.x records of the ids of B:waiting from rank `from`, at most `budget` ids:
-- returns how many were converted and the rank reached.
local function upgrade_waiting(B, from, budget)
  local ids = call('ZRANGE', B .. ':waiting', from, from + budget - 1)
  if #ids == 0 then
    return 0, from
  end
  local there = call('HMGET', B .. ':rec', unpack(ids)) -- (converted already: skipped)
  local n, gone, recs, errs = 0, {}, {}, {}
  for k, id in ipairs(ids) do
    local jkey = B .. ':job:' .. id
    local f = not there[k] and hash_of(jkey)
    if f then
      local v, err = upgraded(f, false)
      recs[#recs + 1], recs[#recs + 2] = id, v
      if err ~= nil then
        errs[#errs + 1], errs[#errs + 2] = id, err
      end
      gone[#gone + 1] = jkey
      n = n + 1
    end
  end
  if n > 0 then
    call('HSET', B .. ':rec', unpack(recs))
    call('DEL', unpack(gone))
  end
  if #errs > 0 then
    call('HSET', B .. ':err', unpack(errs))
  end
  return n, from + #ids
end

-- Convert the set B:blocked of 4.x (its records in B:job:<id>) into the hash of 5.0, whole.
-- Returns how many records were converted (0 when B:blocked is not a set). The set is read
-- whole, however large: its hash is written in slices (sliced).
local function upgrade_blocked(B)
  local bkey = B .. ':blocked'
  local set, members = pcall(call, 'SCARD', bkey) -- (the hash of 5.0 already: WRONGTYPE)
  if not set or members == 0 then
    return 0
  end
  local values, gone = {}, {}
  for _, id in ipairs(call('SMEMBERS', bkey)) do
    local jkey = B .. ':job:' .. id
    local f = hash_of(jkey)
    if f ~= nil then -- (its last error, if any, is the active job's: B:err)
      values[#values + 1] = id
      values[#values + 1] = blocked_value(f, (upgraded(f, false)))
      gone[#gone + 1] = jkey
    end
  end
  call('DEL', bkey)
  sliced('HSET', bkey, values) -- (one unpack() of a set of over 4,000 failed the call after
  sliced('DEL', nil, gone) -- the DEL: its blocked jobs were lost)
  return #values / 2
end

-- Convert the active records (B:active:<id>) of the leases of `client`, at most `budget`:
-- returns how many were converted and whether the client is done. A lease of 3.x ("<token>",
-- its leased_at in the record) or of 4.0.0 ("<token> <leased_at>") is written in the form of
-- 4.1.0 when the record has an enqueued_at (else a lease of 3.x becomes one of 4.0.0). An id
-- whose waiting record was converted too (4.x held both: its dequeue would have blocked it)
-- is blocked behind the active one; an id in B:waiting without a waiting record leaves it.
local function upgrade_leases(B, client, budget)
  local lkey = B .. ':lease:' .. client
  local flat = redis.pcall('HGETALL', lkey)
  if flat.err then -- (not a hash, written around the library: no leases to convert)
    return 0, true
  end
  local n = 0
  for i = 1, #flat, 2 do
    local id, held = flat[i], flat[i + 1]
    local akey = B .. ':active:' .. id
    local f = hash_of(akey)
    if f ~= nil then
      if n >= budget then
        return n, false
      end
      local legacy = not find(held, ' ', 1, true)
      local v, err, nums, attempts = upgraded(f, legacy)
      local waiting = call('HGET', B .. ':rec', id)
      -- (out of B:waiting: a 5.0 job there is waiting, not active; a stray id of 4.x there
      -- without its B:job:<id> is dropped so, as 4.4.0's dequeue dropped it)
      call('ZREM', B .. ':waiting', id)
      if waiting then
        if not call('HGET', B .. ':blocked', id) then
          call('HSET', B .. ':blocked', id, '0 0 clamp - -\t' .. waiting)
        end
      end
      call('HSET', B .. ':rec', id, v)
      if err ~= nil then
        call('HSET', B .. ':err', id, err)
      elseif waiting then
        call('HDEL', B .. ':err', id)
      end
      local token = string.match(held, '^%S*')
      local at = legacy and (f.leased_at or '') or string.match(held, ' (%S*)$')
      local line = held
      if nums ~= nil and (legacy or not find(held, ' %S+ ')) then -- 3.x or 4.0.0
        line = token .. ' ' .. nums .. ' ' .. int(attempts + 1) .. ' '
          .. int(field_int(at, MAX_MS))
      elseif legacy then
        line = token .. ' ' .. int(field_int(at, MAX_MS))
      end
      if line ~= held then
        call('HSET', lkey, id, line)
      end
      call('DEL', akey)
      n = n + 1
    end
  end
  return n, true
end

-- Whether B holds no living job (none of B:waiting, B:blocked, B:expiry): nothing to convert
-- (its ends, schedule, stats are as 4.x wrote them).
local function fresh_queue(B)
  return call('EXISTS', B .. ':waiting', B .. ':blocked', B .. ':expiry') == 0
end

-- One step of the upgrade of B (B:layout missing): converts up to UPGRADE_BUDGET 4.x
-- records. Returns how many were converted, how many are left at most (0: B is marked '5'
-- now, or fresh; more: a count of the ids and leases not looked at yet), and whether B was
-- fresh (fresh_queue: left unmarked, the caller marks it once it holds a job: first_call).
local function upgrade_step(B)
  local ukey = B .. ':upgrade'
  local n = 0
  if fresh_queue(B) then
    return 0, 0, true
  else
    local from = tonumber(call('HGET', ukey, 'waiting')) or 0
    local total = call('ZCARD', B .. ':waiting')
    if from < total then
      n, from = upgrade_waiting(B, from, UPGRADE_BUDGET)
      call('HSET', ukey, 'waiting', int(from))
      if from < total then
        return n, total - from
      end
    end
    n = n + upgrade_blocked(B)
    local clients = call('ZRANGE', B .. ':expiry', 0, -1)
    local done = tonumber(call('HGET', ukey, 'client')) or 0
    for i = done + 1, #clients do
      local converted, whole_ = upgrade_leases(B, clients[i], UPGRADE_BUDGET - n)
      n = n + converted
      call('HSET', ukey, 'client', int(whole_ and i or i - 1))
      if not whole_ then
        local left = 0
        for j = i, #clients do
          left = left + call('HLEN', B .. ':lease:' .. clients[j])
        end
        return n, left
      end
    end
    call('DEL', ukey)
  end
  call('SET', B .. ':layout', '5')
  return n, 0, false
end

local function upgrading(B, detail)
  return redis.error_reply('TRYAGAIN upgrading ' .. B .. ' to library 5.0: ' .. detail)
end

-- Make sure that B is in the 5.0 layout, B:layout being missing (the caller read it): a
-- write call converts a step of it (upgrade_step) and goes on when that was the last, else it
-- is refused (nothing else done); a read-only call (`reads`) cannot write: refused while B
-- holds keys of 4.x to convert, else it reads as 5.0. Returns nil to go on, else the reply;
-- and whether B was fresh (nothing to convert, not marked).
local function layout_of(B, reads)
  if reads then
    if fresh_queue(B) then
      return nil
    end
    return upgrading(B, 'a write call or queasy_upgrade converts its records first')
  end
  local n, left, fresh = upgrade_step(B)
  if left == 0 then
    return nil, fresh
  end
  return upgrading(B, int(n) .. ' records converted, more to go')
end

-- The migration guard's read (see `guard`) joined to the first read of a function and to
-- the layout's (layout_of): EXISTS of `key` (counted twice), B:layout and the guard's two
-- keys of B (never written), so the count says both whether `key` exists and whether B is in
-- the 5.0 layout; nil while B's slot moves: the function refuses with moving(B), nothing
-- read or written (it is registered with entry(fn, true): no read of the guard before it).
-- A queue not in the 5.0 layout yet is upgraded first (a step of it: a call refused with
-- TRYAGAIN upgrading when more is left, nothing else done). Also returns whether B was fresh
-- (layout_of: no job, no mark; dequeue marks it once it registered its client).
local function guarded_exists(B, key)
  local read, found = pcall(call, 'EXISTS', key, key, B .. ':layout', B .. ':guard:1',
    B .. ':guard:2')
  if not read then
    return nil
  elseif found % 2 == 1 then
    return (found - 1) / 2
  end
  local refused, fresh = layout_of(B, false)
  if refused ~= nil then
    error(refused)
  end
  return call('EXISTS', key), fresh
end

local function moving(B)
  return redis.error_reply('TRYAGAIN the hash slot of ' .. B .. ' is moving; try again')
end

-- Sweep one dead client (expiry passed), other than `self`: its active jobs go back to
-- waiting with stall_count + 1 (a blocked job's update merged, as requeue does), one
-- 'stalled' event each, their last error a StallError. Bounded: at most one client per call;
-- its records in one HMGET of B:rec and one of B:blocked, written back in one HSET.
local function sweep_one(B, now, self, maxlen)
  local dead = call('ZRANGE', B .. ':expiry', '-inf', int(now), 'BYSCORE', 'LIMIT', 0, 2)
  for _, client in ipairs(dead) do
    if client ~= self then
      local lkey = B .. ':lease:' .. client
      local leases = call('HGETALL', lkey)
      if #leases > 0 then
        local ids = {}
        for k = 1, #leases, 2 do
          ids[#ids + 1] = leases[k]
        end
        local recs = hmget_sliced(B .. ':rec', ids) -- (a client may hold thousands)
        local blocked = hmget_sliced(B .. ':blocked', ids)
        local out = requeue_batch()
        for n, id in ipairs(ids) do
          local held = leases[2 * n]
          local token = string.match(held, '^[^ ]*') -- (as holds() reads it: to the first space)
          local job = leased(client, id, token, held, recs[n])
          if job ~= nil then
            job.stall_count = job.stall_count + 1
            local err = {name = 'StallError', kind = 'stall', traceback = '',
              message = 'its supervisor (client ' .. client .. ') was swept as dead: no '
                .. 'heartbeat for its expiry'}
            outcome_event(B, maxlen, int(now), 'stalled', job, '', '', err)
            requeue(job, now, err, now, blocked[n], out)
          end
        end
        requeued(B, out)
      end
      call('DEL', lkey)
      call('HDEL', B .. ':parked', client)
      call('ZREM', B .. ':expiry', client)
      call('ZREM', B .. ':fresh', client)
      call('ZADD', B .. ':swept', int(now), client)
      call('ZREMRANGEBYSCORE', B .. ':swept', '-inf', int(now - TOMBSTONE_MS))
      return 1
    end
  end
  return 0
end

-- Register `client` as alive until now + expiry_ms, and fresh (pushes go to it) for half of
-- that. Returns false when it was swept.
local function keep_alive(B, now, client, expiry_ms)
  if call('ZSCORE', B .. ':swept', client) ~= false then
    return false
  end
  call('ZADD', B .. ':expiry', int(now + expiry_ms), client)
  call('ZADD', B .. ':fresh', int(now + math.floor(expiry_ms / 2)), client)
  return true
end

-- The fresh clients parked on B, as a list of {client, slots}: a client is fresh while at
-- least half its expiry window is left (it bumped or dequeued lately); others are dropped
-- from B:parked (a frozen client keeps its subscription, but not its heartbeat). One
-- ZMSCORE for all.
local function live_parked(B, now)
  local pkey = B .. ':parked'
  local flat = call('HGETALL', pkey)
  local out = {}
  if #flat == 0 then
    return out
  end
  local clients = {}
  for i = 1, #flat, 2 do
    clients[#clients + 1] = flat[i]
  end
  -- (in slices: one unpack() of over 8,000 clients failed every dispatch of the queue)
  local fresh, stale = read_sliced('ZMSCORE', B .. ':fresh', clients), {}
  for k, client in ipairs(clients) do
    if fresh[k] and tonumber(fresh[k]) >= now then
      out[#out + 1] = {client, tonumber(flat[2 * k])}
    else
      stale[#stale + 1] = client
    end
  end
  if #stale > 0 then
    sliced('HDEL', pkey, stale)
  end
  return out
end

-- The trace a push message carries: the record's when it is a traceparent's characters
-- (0-9 a-f -) and at most MAX_TRACE bytes, else '' (one written around the library: a newline
-- in it would shift the message's data, which comes last; 4.3.0).
local function pushed_trace(trace)
  return trace_like(trace) and trace or ''
end

-- Push the waiting job `id`, of record string `record`, to the parked client with the most
-- slots, if one is subscribed to its exact push channel (PUBSUB SHARDNUMSUB: the subscribers
-- on this primary; a client that does not listen is unparked). Returns true when pushed
-- (leased to that client: its record stays in B:rec as it is; the caller takes the id out
-- of B:waiting), false to leave it waiting.
local function push(B, now, id, parked, record)
  while true do
    local best = nil
    for _, entry in ipairs(parked) do
      if entry[2] > 0 and (best == nil or entry[2] > best[2]) then
        best = entry
      end
    end
    if best == nil then
      return false
    end
    local client = best[1]
    local channel = B .. ':push:' .. client
    if call('PUBSUB', 'SHARDNUMSUB', channel)[2] > 0 then
      local run_at, retry, stall, timeout, trace, data = rec_lease(record)
      if run_at == nil then
        return false -- (not a record: a dispatch writes one, or leaves one in waiting)
      end
      local token = 'p' .. call('INCR', B .. ':seq')
      call('SPUBLISH', channel, table.concat({id, token, run_at, retry, stall, timeout,
        pushed_trace(trace), data}, '\n'))
      call('HSET', B .. ':lease:' .. client, id, lease_line(token, int(now)))
      best[2] = best[2] - 1
      if best[2] > 0 then
        call('HSET', B .. ':parked', client, int(best[2]))
      else
        call('HDEL', B .. ':parked', client)
      end
      return true
    end
    best[2] = 0
    call('HDEL', B .. ':parked', client)
  end
end

local function next_run_at(B)
  local first = call('ZRANGE', B .. ':waiting', 0, 0, 'WITHSCORES')
  if first[2] == nil then
    return ''
  elseif numeral(first[2]) then -- (a score as the library writes it, as the server shows it)
    return first[2]
  end
  return int(tonumber(first[2]))
end

-- Whether the job `id` is active: it has a record in B:rec and is not in B:waiting (its
-- lease is in B:lease:<client>; a blocked job with its id waits in B:blocked).
local function is_active(B, id)
  return call('HEXISTS', B .. ':rec', id) == 1
    and call('ZSCORE', B .. ':waiting', id) == false
end

-- The occurrence of B's schedule (job id SCHEDULE_ID) ended (`outcome` finished, failed or
-- cancelled; a cancelled blocked copy while it is active is no end): B:schedule keeps its
-- fire time and outcome, for status (`active_ended`: the caller ends the active record
-- itself, finish and fail). Other ids cost nothing. Without `active_ended` (cancel) the
-- caller calls it after the cancelled record left B:rec (or the blocked copy B:blocked).
local function schedule_ended(B, id, now, outcome, active_ended)
  if id == SCHEDULE_ID and call('EXISTS', B .. ':schedule') == 1
      and (active_ended or not is_active(B, id)) then
    local skey = B .. ':schedule'
    call('HSET', skey, 'last_fire_at', call('HGET', skey, 'fire_at') or '',
      'last_outcome', outcome, 'last_ended_at', int(now))
  end
end

-- ================================================================ entry points, grouped by the
-- state they change (helpers above; registration at the end)

-- ---------------------------------------------------------------- producers: dispatch, cancel

-- The flags ARGV[2..4] of queasy_dispatch and queasy_dispatch_once, checked.
local function dispatch_flags(args)
  local update_data = flag(args[2], 'update_data')
  local mode = args[3]
  if not RUN_AT_MODES[mode] then
    invalid("update_run_at must be 'replace', 'keep', 'if_later' or 'if_earlier', got "
      .. shown(mode))
  end
  return update_data, mode, flag(args[4], 'reset_counts')
end

-- The triples (id, data, run_at) of ARGV from index `from`, checked; returns their run_ats
-- (job n of the batch is the n-th triple; '' is now).
local function dispatch_triples(args, from, now, name)
  groups(args, from, 3, name)
  if (#args - from + 1) / 3 > MAX_DISPATCH then
    invalid(name .. ': at most ' .. MAX_DISPATCH .. ' jobs per call, got ' .. (#args - from + 1)
      / 3)
  end
  local run_ats = {}
  strict_json(function()
    local decode = cjson.decode
    local valid = pcall(function() -- the usual batch: all JSON, one protected call for all
      for i = from + 1, #args, 3 do
        decode(args[i])
      end
    end)
    for i = from, #args, 3 do
      local n = (i - from) / 3 + 1
      check_id(args[i], 'id', n)
      if not valid then
        check_json(args[i + 1], 'data', n) -- which one is not
      end
      run_ats[n] = args[i + 2] == '' and now or ms(args[i + 2], 'run_at', n)
    end
  end)
  return run_ats
end

-- Refuse a producer's job of SCHEDULE_ID (in the triples of ARGV from `from`) while the queue
-- has a schedule (B:schedule): it would move or stall the occurrence and replace its
-- fire_at (4.3.0). queasy_schedule writes the occurrence itself, never through a dispatch.
local function check_reserved(B, args, from)
  for i = from, #args, 3 do
    if args[i] == SCHEDULE_ID then
      if call('EXISTS', B .. ':schedule') == 1 then
        invalid(label("id '" .. SCHEDULE_ID .. "' is reserved", (i - from) / 3 + 1)
          .. ': the id of the occurrence of this queue\'s schedule')
      end
      return
    end
  end
end

--[[ What a call that dispatches knows of its ids (a batch): read once for all, as it
begins (batch_open: one HMGET of B:rec; ZMSCORE of B:waiting for the ids that have a record,
to tell a waiting one from an active one; HMGET of B:blocked for the active ones), changed
as its jobs are put (batch_put) and pushed, and written once, at the end (batch_close: one
HSET of B:rec, one ZADD of B:waiting, one HSET of B:blocked; one ZREM of the ids pushed).
An id's state: 'waiting' (waiting or delayed: a record in B:rec and in B:waiting),
'active' (a record not in B:waiting: leased, or pushed in this call), or nil (none). A value
of B:rec that is not a record (written around the library) reads as none while its id is in
B:waiting (a dispatch writes over it, as 4.x over a record without its id field), as active
otherwise. Each put appends its writes to the lists of the batch's commands (`recs`: id,
record; `scored`: run_at, id; `blocked`: id, value): an id put twice is in them twice, and
the later pair wins (HSET and ZADD take their pairs in order). A new id costs no command of
its own, and no table but its record's (the next put of that id reads it). ]]
local function batch_open(B, ids, update_data, mode, reset, now_s, trace)
  local st = {B = B, state = {}, rec = {}, blk = {}, found = {}, recs = list(),
    scored = list(), blocked = nil, pushed = nil, update_data = update_data, mode = mode,
    reset = reset, now_s = now_s, trace = trace or ''}
  if #ids == 0 then
    return st
  end
  local v = call('HMGET', B .. ':rec', unpack(ids))
  local present = nil
  for k, id in ipairs(ids) do
    if v[k] and not st.found[id] then
      st.found[id] = true
      st.rec[id] = v[k]
      present = present or list()
      present[#present + 1] = id
    end
  end
  if present == nil then -- the usual batch of new ids: one command
    return st
  end
  local scores, active = call('ZMSCORE', B .. ':waiting', unpack(present)), nil
  for k, id in ipairs(present) do
    if not scores[k] then
      st.state[id] = 'active'
      active = active or list()
      active[#active + 1] = id
    elseif rec_parts(st.rec[id]) ~= nil then
      st.state[id] = 'waiting'
    else
      st.rec[id] = nil
    end
  end
  if active ~= nil then
    local b = call('HMGET', B .. ':blocked', unpack(active))
    for k, id in ipairs(active) do
      st.blk[id] = b[k] or nil
    end
  end
  return st
end

-- Write one dispatched job into the batch, with the batch's flags (batch_open: update_data,
-- mode, reset; now_s, trace): a new waiting job (code 1), an update of the waiting one (2),
-- or a job blocked behind the active one (3 new, 4 its update composed, so that the updates
-- apply to the active job, if it is requeued, as to a waiting job: the run_at merges
-- composed, the union of the other flags). A new record gets the trace ('' none) and
-- enqueued_at now_s; an update keeps its trace, enqueued_at and attempts. Returns the code
-- and the run_at the job now has.
local function batch_put(st, id, data, run_at)
  local state, recs, scored = st.state[id], st.recs, st.scored
  local n, m = #recs, #scored
  if state == nil then -- a new id (or a value that is no record)
    -- (rec_pack's string, its constant parts joined)
    local at = int(run_at)
    local record = at .. ' ' .. st.now_s .. ' 0 0 0 0\t' .. st.trace .. '\t' .. data
    st.rec[id], st.state[id] = record, 'waiting'
    recs[n + 1], recs[n + 2], scored[m + 1], scored[m + 2] = id, record, at, id
    return 1, run_at
  end
  local update_data, mode, reset = st.update_data, st.mode, st.reset
  if state == 'waiting' then
    local job = rec_job(id, st.rec[id])
    if update_data then
      job.data = data
    end
    job.run_at = merge_run_at(job.run_at, run_at, mode)
    if reset then
      job.retry_count, job.stall_count, job.timeout_count = 0, 0, 0
    end
    local record = rec_of(job)
    st.rec[id] = record
    recs[n + 1], recs[n + 2], scored[m + 1], scored[m + 2] = id, record, int(job.run_at), id
    return 2, job.run_at
  end
  -- the id is active: a blocked job waits for it
  local u, record = blocked_parts(st.blk[id])
  local code = 4
  if u == nil then
    local kind, lo, hi = then_merge('clamp', nil, nil, mode, run_at)
    st.blk[id] = blocked_pack(update_data, reset, kind, lo, hi,
      rec_pack(int(run_at), st.now_s, '0', '0', '0', '0', st.trace, data))
    code = 3
  else
    local job = rec_job(id, record)
    local old_run_at = job.run_at
    if update_data then
      job.data = data
    end
    job.run_at = merge_run_at(old_run_at, run_at, mode)
    if reset then
      job.retry_count, job.stall_count, job.timeout_count = 0, 0, 0
    end
    local kind, lo, hi = run_at_update(u.u_run_at, u.u_lo, u.u_hi, old_run_at)
    kind, lo, hi = then_merge(kind, lo, hi, mode, run_at)
    st.blk[id] = blocked_pack(update_data or u.u_data, reset or u.u_reset, kind, lo, hi,
      rec_of(job))
    run_at = job.run_at
  end
  local blocked = st.blocked or list()
  blocked[#blocked + 1], blocked[#blocked + 2], st.blocked = id, st.blk[id], blocked
  return code, run_at
end

-- The waiting job `id` of the batch, just put, was pushed (leased to a parked client): it is
-- active now, and leaves B:waiting (after the batch's ZADD, which may hold it: one ZREM).
local function batch_pushed(st, id)
  st.state[id] = 'active'
  local pushed = st.pushed or list()
  pushed[#pushed + 1], st.pushed = id, pushed
end

-- Write what the batch changed: the records (B:rec), the run_ats of the jobs put waiting
-- (B:waiting) and the ids pushed out of it, the blocked jobs (B:blocked).
local function batch_close(st)
  local B = st.B
  if #st.recs > 0 then
    call('HSET', B .. ':rec', unpack(st.recs))
    call('ZADD', B .. ':waiting', unpack(st.scored))
  end
  if st.pushed ~= nil then
    call('ZREM', B .. ':waiting', unpack(st.pushed))
  end
  if st.blocked ~= nil then
    call('HSET', B .. ':blocked', unpack(st.blocked))
  end
end

-- Put each triple of ARGV from `from` with `put(st, id, data, run_at)` (-> code, run_at:
-- batch_put, or a function that calls it) into the batch `st`; a job left waiting (code 1
-- or 2) and ready now is pushed to a parked client, else counted for the wake-up. The
-- batch is written at the end (nothing reads B:rec or B:waiting in between). Returns the
-- codes.
local function dispatch_jobs(st, now, args, from, run_ats, put)
  local B = st.B
  local codes = {}
  local earliest = nil
  local parked = nil -- read once, when the first job ready now is met
  for i = from, #args, 3 do
    local id = args[i]
    local code, run_at = put(st, id, args[i + 1], run_ats[(i - from) / 3 + 1])
    codes[#codes + 1] = code
    if code <= 2 then
      if run_at <= now then
        if parked == nil then
          parked = live_parked(B, now)
        end
        if #parked > 0 and push(B, now, id, parked, st.rec[id]) then
          batch_pushed(st, id)
          run_at = nil -- leased to a parked client: nothing to wake
        end
      end
      if run_at ~= nil and (earliest == nil or run_at < earliest) then
        earliest = run_at
      end
    end
  end
  batch_close(st)
  if earliest ~= nil then
    call('SPUBLISH', B .. ':wake', int(earliest))
  end
  return codes
end

-- The ids of the triples of ARGV from `from`, in order.
local function triple_ids(args, from)
  local ids = list()
  for i = from, #args, 3 do
    ids[#ids + 1] = args[i]
  end
  return ids
end

--[[ queasy_dispatch: add or update jobs (one or many).
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  update_data '1'|'0': replace the data of an existing waiting/blocked job
ARGV[3]  update_run_at 'replace'|'keep'|'if_later'|'if_earlier'
ARGV[4]  reset_counts '1'|'0': zero retry/stall/timeout counts of an existing job
ARGV[5]  trace: the W3C traceparent current at the dispatch ('' none), kept in each new
         record (OpenTelemetry: the job's run continues that trace)
ARGV[6..] triples: id, data (JSON), run_at (ms, or '' for now)
Returns: one code per job: 1 created, 2 updated, 3 blocked (new), 4 blocked (updated).
Refuses: (INVALID, nothing written) more than MAX_DISPATCH (1000) jobs, a flag or mode not
         listed, a partial triple, an id that
         breaks the id rules, data that is not JSON, a run_at not integer ms in 0..MAX_MS,
         a trace longer than MAX_TRACE or with other characters than 0-9 a-f and '-', the
         id SCHEDULE_ID ('schedule') while the queue has a schedule (B:schedule: the id of
         its occurrence, which queasy_schedule writes; 4.3.0).
Emits:   a job ready now (code 1 or 2) is pushed to a fresh parked client subscribed to its
         push channel while one has slots (leased to it and SPUBLISHed on B:push:<client>);
         otherwise SPUBLISH B:wake <earliest run_at> when any job was created or updated and
         left waiting.
Cost:    per call, not per job (5.0): one HMGET of B:rec for the ids (ZMSCORE of B:waiting
         and HMGET of B:blocked only for those that have a record), one HSET of B:rec, one
         ZADD of B:waiting (one HSET of B:blocked with blocked jobs); a push costs its own.
]]
local function dispatch(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  local update_data, mode, reset = dispatch_flags(args)
  local trace = check_trace(args[5])
  local run_ats = dispatch_triples(args, 6, now, 'queasy_dispatch')
  check_reserved(B, args, 6)
  local now_s = int(now)
  local st = batch_open(B, triple_ids(args, 6), update_data, mode, reset, now_s, trace)
  return dispatch_jobs(st, now, args, 6, run_ats, batch_put)
end

-- The dedup window of queasy_dispatch_once. A window that ends within `window` ms of the call
-- (a job ready now: most of them) is a field of a bucket hash, B:window:<size>:<k>, that holds
-- the windows ending in [k * size, (k + 1) * size) and expires once, at its end (size: the
-- window rounded up to a power of two ms, so a window is in one of two live buckets per
-- size); B:windows lists the live buckets. A later window (a delayed job's) is a key of its
-- own, B:once:<id> (as library 4.0.0 kept every window: those are read until they expire).

-- The bucket size of a window (ms): the least power of two >= window.
local function window_size(window)
  local size = 1
  while size < window do
    size = size * 2
  end
  return size
end

-- The latest end (ms) of a window of each of `ids` in a live bucket: id -> end; an id with
-- none is absent. Drops the buckets that ended from B:windows.
local function open_windows(B, now, ids)
  local index = B .. ':windows'
  call('ZREMRANGEBYSCORE', index, '-inf', int(now))
  local live = call('ZRANGE', index, 0, -1)
  local open = {}
  if #live == 0 then
    return open
  end
  local n = #ids
  for _, bucket in ipairs(live) do
    local ends = call('HMGET', B .. ':window:' .. bucket, unpack(ids))
    for j = 1, n do
      local at = ends[j] and tonumber(ends[j])
      if at and (open[ids[j]] or 0) < at then
        open[ids[j]] = at
      end
    end
  end
  return open
end

-- Write the windows of a call at `now` with `window`: `ready` (id, end, id, end, ...: jobs
-- ready now, whose windows all end at now + window) into their bucket, `later` (id -> end)
-- into B:once:<id>.
local function write_windows(B, now, window, ready, later)
  if #ready > 0 then
    local size = window_size(window)
    local k = math.floor((now + window) / size)
    local name = int(size) .. ':' .. int(k)
    local key, ends = B .. ':window:' .. name, (k + 1) * size
    call('HSET', key, unpack(ready))
    call('PEXPIRE', key, int(ends - now))
    call('ZADD', B .. ':windows', int(ends), name)
  end
  for id, close in pairs(later) do
    call('SET', B .. ':once:' .. id, int(close), 'PX', int(close - now))
  end
end

--[[ queasy_dispatch_once: dispatch a batch that may be sent again (a retried Spark task, a
re-run of a whole job): an id that already ran, or runs now, is not dispatched a second time.
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2..4] update_data, update_run_at, reset_counts: as queasy_dispatch
ARGV[5]  window ms (1 ..= 999999999999): an id stays dispatched until its run_at + window
ARGV[6..] triples: id, data (JSON), run_at (ms, or '' for now)
Returns: one code per job: 1 created, 2 updated (its waiting or delayed job, as
         queasy_dispatch), 5 skipped (nothing written for it): the id is active (leased:
         running, or pushed to a client), or it has no waiting job but a window of it is
         still open (it was dispatched once, then ran, failed or was cancelled).
         Never 3 or 4: a blocked copy would run the id a second time.
Writes:  for each job created or updated, the end of its window, max(run_at, now) + window
         (ms): into its bucket B:window:<size>:<k> (listed in B:windows) when it ends within
         window of now, else B:once:<id>, expiring then. An id's window is open while any
         window written for it is (the latest end counts).
Refuses: as queasy_dispatch (the id SCHEDULE_ID of a scheduled queue too); and a window that
         is not a whole number 1..999999999999.
Emits:   as queasy_dispatch.
Cost:    as queasy_dispatch's, and one MGET of the B:once:<id> of the ids without a job.
]]
local function dispatch_once(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  local update_data, mode, reset = dispatch_flags(args)
  local window = whole(args[5], 'window ms', MAX_COUNT)
  if window < 1 then
    invalid('window ms must be >= 1, got 0')
  end
  local run_ats = dispatch_triples(args, 6, now, 'queasy_dispatch_once')
  check_reserved(B, args, 6)
  local now_s = int(now)
  local ids = triple_ids(args, 6)
  local open = open_windows(B, now, ids)
  local st = batch_open(B, ids, update_data, mode, reset, now_s, '')
  -- the windows of their own (B:once:<id>) of the ids without a job: one MGET for all
  local once, oids = {}, list()
  for _, id in ipairs(ids) do
    if not st.found[id] and not once[id] then
      once[id] = true
      oids[#oids + 1] = B .. ':once:' .. id
    end
  end
  if #oids > 0 then
    local v = call('MGET', unpack(oids))
    for k, okey in ipairs(oids) do
      once[string.sub(okey, #B + 7)] = v[k]
    end
  end
  -- the windows to write: `ready` (id, end, ...) of the jobs ready now, `later` id -> end
  local ready, later, ready_end, n, ended = {}, {}, int(now + window), 0, nil
  local function mark(id, at) -- the window of `id`, dispatched with run_at `at`
    if at <= now then
      ready[n + 1], ready[n + 2] = id, ready_end
      n = n + 2
    else
      later[id] = at + window
    end
  end
  local codes = dispatch_jobs(st, now, args, 6, run_ats, function(_, id, data, run_at)
    local state = st.state[id]
    if state == 'active' then -- (leased: running, or pushed to a client; a blocked copy
      return 5 -- would run the id a second time)
    elseif state == nil and not st.found[id] then -- no job of the id: its window, if any,
      -- must have ended (a value of B:rec that is no record, in B:waiting: written over,
      -- as 4.x's put_job wrote over a record without its id field)
      local own = once[id]
      local close = math.max(open[id] or 0, own and tonumber(own) or 0) -- (garbled: none)
      if close > now then
        return 5
      end
      if own then -- that window ended (not yet expired on the server's clock) or is garbled
        once[id] = false
        ended = ended or list()
        ended[#ended + 1] = B .. ':once:' .. id
      end
    end
    local code, at = batch_put(st, id, data, run_at)
    mark(id, at) -- its window, from the run_at it now has
    return code, at
  end)
  if ended ~= nil then -- (before write_windows: a delayed job's window may be one of them)
    call('DEL', unpack(ended))
  end
  write_windows(B, now, window, ready, later)
  return codes
end

--[[ queasy_dispatch_letter: dispatch a dead letter's job again, unless it ran again since
(4.3.0). The check and the dispatch are one step: no other call can make the id live, or
end it, in between (queasy_py/handlers/dead_letter.py).
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  trace ('' none), as queasy_dispatch's ARGV[5]
ARGV[3]  id
ARGV[4]  data (JSON)
ARGV[5]  the run_at (ms) of the run whose failure wrote the letter, or '' when the letter
         does not say
Returns: 1 dispatched (a new waiting job ready now, pushed or woken as by queasy_dispatch),
         5 skipped: the id is live (waiting, delayed, blocked or active), or the retention
         keeps an end of it that is not that run's failure (it finished, was cancelled, or a
         later run failed: it ran again already; with ARGV[5] '' any failed end is taken
         as that run's). An id with no end kept is dispatched.
Refuses: (INVALID, nothing written) an id that breaks the id rules, data that is not JSON, a
         run_at not integer ms in 0..MAX_MS, a trace as queasy_dispatch refuses it, the id
         SCHEDULE_ID while the queue has a schedule.
Emits:   as queasy_dispatch.
]]
local function dispatch_letter(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  if #args ~= 5 then
    invalid('queasy_dispatch_letter takes 5 arguments, got ' .. #args)
  end
  local trace = check_trace(args[2])
  check_id(args[3], 'id')
  strict_json(function()
    check_json(args[4], 'data')
  end)
  local failed_at = args[5] ~= '' and ms(args[5], 'run_at of the failure')
  check_reserved(B, args, 3)
  local id = args[3]
  local st = batch_open(B, {id}, false, 'keep', false, int(now), trace)
  if st.found[id] then -- (a blocked job waits for an active one: its id has a record too)
    return 5
  end
  local done = call('HGET', B .. ':ends', id)
  local state = end_state(done)
  if state ~= nil then
    local run_at = string.match(done, '^%S+ %S+ %S+ %S+ %S+ (%S+)')
    if state ~= 'failed' or (failed_at and tonumber(run_at) ~= failed_at) then
      return 5
    end
  end
  return dispatch_jobs(st, now, args, 3, {now}, batch_put)[1]
end

--[[ queasy_cancel: remove a waiting, delayed or blocked job. Never touches an active job.
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  events maxlen (0: no event)
ARGV[3]  id
ARGV[4]  keep count: cancelled records kept (0: none; see Retention)
ARGV[5]  keep ms: how long cancelled records are kept
Returns: 1 if a job was removed (its record kept as cancelled), else 0.
Emits:   event outcome=cancelled; SPUBLISH B:done:<id> 'cancelled'. The end of a schedule's
         occurrence is noted in B:schedule.
]]
local function cancel(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  local maxlen = whole(args[2], 'events maxlen', MAX_COUNT)
  local id = args[3]
  local keep_count = whole(args[4], 'keep count', MAX_COUNT)
  local keep_ms = whole(args[5], 'keep ms', MAX_MS)
  -- the blocked job of an active id first (4.x's one B:job:<id> was that one), else the
  -- record of B:rec while it is waiting or delayed (not active: in B:waiting)
  local v, errv = call('HGET', B .. ':blocked', id), false
  local is_blocked = v ~= false
  if is_blocked then
    v = select(2, blocked_parts(v)) or false -- (a value that is not one: no job)
    if not v then
      return 0
    end
  else
    v = call('HGET', B .. ':rec', id)
    if not v or call('ZSCORE', B .. ':waiting', id) == false then
      return 0
    end
  end
  local job = rec_job(id, v) or rec_job(id, '0 - 0 0 0 0\t\t')
  local keep = keep_count > 0 and keep_ms > 0
  if is_blocked then
    call('HDEL', B .. ':blocked', id)
  else
    if keep then
      errv = call('HGET', B .. ':err', id)
    end
    call('ZREM', B .. ':waiting', id)
    drop_living(B, {id})
  end
  local at, counts = outcome_event(B, maxlen, int(now), 'cancelled', job, '', '', nil)
  local out = ends_batch()
  end_record(B, id, keep, ended_fields(id, v, errv, nil), out)
  write_ended(out)
  unended(B, out)
  if #out.gone > 0 then
    call('DEL', unpack(out.gone))
  end
  retain(B, 'cancelled', now, keep_count, keep_ms, {int(now), id},
    {id, ending('cancelled', at, counts, job.attempts, '')})
  call('SPUBLISH', B .. ':done:' .. id, 'cancelled')
  if not is_blocked then -- (a blocked copy cancelled while its id is active is no end)
    schedule_ended(B, id, now, 'cancelled', true)
  end
  return 1
end

--[[ queasy_requeue: put failed jobs (their kept records) back in waiting, to run now.
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  cutoff (ms or '': now): with no ids, take the records that failed at or before it
ARGV[3]  limit (1..MAX_PAGE): with no ids, how many of the oldest such records
ARGV[4..] ids (optional, at most MAX_PAGE; the id rules): these records (an id without a
          failed record is skipped)
Refuses: the id SCHEDULE_ID while the queue has a schedule (B:schedule), and with no ids
         passes over its record (not looked at, kept): the schedule makes its next occurrence
         itself, a requeued one would run the periodic job once more (4.3.1)
Returns: {requeued, cutoff, looked at}: how many records were requeued, the cutoff used
         (pass it again to go on without taking jobs that failed since), and how many ids
         were looked at (fewer than limit: none is left). Each becomes a new job with
         its data and counts 0, waiting (or blocked behind an active job with its id); an
         id that already has a waiting or blocked job keeps that one. The records go.
Emits:   SPUBLISH B:wake when a job was made waiting; no event (a requeue is a dispatch).
]]
local function requeue_failed(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  local cutoff = now
  if args[2] ~= '' then
    cutoff = ms(args[2], 'cutoff')
  end
  local limit = page(args[3], 'limit')
  if #args - 3 > MAX_PAGE then
    invalid('at most ' .. MAX_PAGE .. ' ids per call, got ' .. (#args - 3))
  end
  local ids = {}
  for i = 4, #args do
    ids[#ids + 1] = check_id(args[i], 'id', i - 3)
  end
  -- the occurrence of B's schedule is never requeued: the schedule makes the next one
  -- itself, a requeued one would run the periodic job once more (4.3.1: in the same step as
  -- the requeue, so a schedule made after the caller looked cannot let one through)
  local scheduled = call('EXISTS', B .. ':schedule') == 1
  if #ids == 0 then
    ids = call('ZRANGE', B .. ':failed', '-inf', int(cutoff), 'BYSCORE', 'LIMIT', 0,
      scheduled and limit + 1 or limit)
    if scheduled then
      local others = {}
      for _, id in ipairs(ids) do
        if id ~= SCHEDULE_ID and #others < limit then
          others[#others + 1] = id
        end
      end
      ids = others
    end
  elseif scheduled then
    for _, id in ipairs(ids) do
      if id == SCHEDULE_ID then
        invalid("id '" .. SCHEDULE_ID .. "' is the occurrence of this queue's schedule, "
          .. 'which makes the next one itself: not requeued (no job was)')
      end
    end
  end
  local done, wake = 0, false
  for _, id in ipairs(ids) do
    local ekey = B .. ':ended:' .. id
    if end_state(call('HGET', B .. ':ends', id)) ~= 'failed' then
      call('ZREM', B .. ':failed', id) -- an id that ended again since, in another state
    else
      -- a new job (counts 0, data of the record, now), unless one with its id waits (in
      -- B:waiting, or blocked): waiting, or blocked behind the active one (its update as a
      -- dispatch's that replaces data and run_at and resets the counts)
      if call('HEXISTS', B .. ':blocked', id) == 0 then
        local lives = call('HEXISTS', B .. ':rec', id) == 1 -- (waiting or active)
        if not lives or call('ZSCORE', B .. ':waiting', id) == false then
          local rec = rec_pack(int(now), int(now), '0', '0', '0', '0', '',
            call('HGET', ekey, 'data') or 'null')
          if lives then -- active
            call('HSET', B .. ':blocked', id,
              blocked_pack(true, true, 'replace', nil, nil, rec))
          else
            call('HSET', B .. ':rec', id, rec)
            call('ZADD', B .. ':waiting', int(now), id)
            wake = true
          end
        end
      end
      call('DEL', ekey)
      call('HDEL', B .. ':ends', id)
      call('ZREM', B .. ':failed', id)
      done = done + 1
    end
  end
  if wake then
    call('SPUBLISH', B .. ':wake', int(now))
  end
  return {done, cutoff, #ids}
end

--[[ queasy_purge: remove up to `limit` jobs of one state. Never touches an active job.
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  state: 'waiting' (ready now) | 'delayed' | 'blocked' | 'finished' | 'failed' |
         'cancelled' (the last three: the kept records)
ARGV[3]  limit (1..MAX_PAGE)
ARGV[4]  counted '1'|'0' (optional, 4.3.0; absent: '0'): with '1' the reply has a third
         value, the jobs really dropped
Returns: {removed, left} (with counted: {removed, left, dropped}): removed is how many ids
         the call took from that state's index (a caller pages on it: fewer than limit, none
         is left), left how many of that state are left (a caller looping until none are
         left stops after `removed + left` of the first call, so jobs that keep coming cannot
         keep it going), dropped how many records or kept ends really went: an id of an end
         index whose end is of another state (it ended again since) is only unindexed, and
         counts in removed (as before 4.3.0) but not in dropped, so a purge of every state
         counts a job that finished, then failed under the same id, once.
Emits:   nothing: no event, no SPUBLISH (a purge is an operator's clean-up, not an outcome).
]]
local function purge(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  local state = args[2]
  local limit = page(args[3], 'limit')
  local counted = args[4] ~= nil and args[4] ~= '' and flag(args[4], 'counted')
  local ids, left, dropped
  if state == 'waiting' or state == 'delayed' then
    local low, high = '-inf', int(now)
    if state == 'delayed' then
      low, high = '(' .. int(now), '+inf'
    end
    ids = call('ZRANGE', B .. ':waiting', low, high, 'BYSCORE', 'LIMIT', 0, limit)
    dropped = 0
    if #ids > 0 then
      call('ZREM', B .. ':waiting', unpack(ids))
      dropped = call('HDEL', B .. ':rec', unpack(ids)) -- (an id in B:waiting is not active)
      call('HDEL', B .. ':err', unpack(ids))
    end
    left = call('ZCOUNT', B .. ':waiting', low, high)
  elseif state == 'blocked' then
    ids = call('HRANDFIELD', B .. ':blocked', limit)
    dropped = 0
    if #ids > 0 then
      dropped = call('HDEL', B .. ':blocked', unpack(ids))
    end
    left = call('HLEN', B .. ':blocked')
  elseif END_STATES[state] then
    ids = call('ZRANGE', B .. ':' .. state, 0, limit - 1)
    dropped = drop_ends(B, state, ids)
    if #ids > 0 then
      call('ZREMRANGEBYRANK', B .. ':' .. state, 0, #ids - 1)
    end
    left = call('ZCARD', B .. ':' .. state)
  else
    invalid('state must be waiting, delayed, blocked, finished, failed or cancelled, got '
      .. shown(state))
  end
  if counted then
    return {#ids, left, dropped}
  end
  return {#ids, left}
end

-- ---------------------------------------------------------------- lease cycle: dequeue ... fail

--[[ queasy_dequeue: check out up to `limit` ready jobs (run_at <= now) for a client.
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  client id (the id rules)
ARGV[3]  nonce: lease tokens are <nonce>.<n> (the id rules)
ARGV[4]  limit (>= 0; 0 only bumps and sweeps; above MAX_DEQUEUE (1000), 1000: the leases
         go to one HSET, and Lua's stack holds 8000 values)
ARGV[5]  expiry ms (>= 1): the client is alive until now + expiry, fresh for half of it
ARGV[6]  events maxlen (for events of a sweep)
ARGV[7]  park '1'|'0' (optional): with '1', when fewer than `limit` jobs are ready the
         client parks the slots left (B:parked), so dispatch pushes jobs straight to it;
         when `limit` jobs were checked out its parked slots are cleared
ARGV[8]  reply (optional, 5.1.0): '' or absent: 8 values per job (below); 'rec': 3 values
         per job, {id, token, record}, the record string of the job as B:rec holds it
         ("<run_at> <enqueued_at> <retry_count> <stall_count> <timeout_count>
         <attempts>\t<trace>\t<data>", see "records (5.0 layout)"), handed out as stored; one
         whose numbers were garbled around the library, or whose trace is longer than
         MAX_TRACE, is handed out normalized (rec_pack of what the lease read: a garbled
         number 0, enqueued_at unknown 0, the trace '')
Returns: {status, next_run_at, id, token, data, run_at, retry_count, stall_count,
          timeout_count, trace ('' none, and '' for one longer than MAX_TRACE written around
          the library: 4.3.0), id, ...} (with ARGV[8] 'rec': {status, next_run_at, id, token,
          record, id, ...}): status 0 ok or 2 swept (then no jobs); next_run_at is
          the earliest run_at still waiting ('' if none), so the caller can sleep until then.
          Each job leased is written to B:lease:<client> as "<token> <now>" (lease_line).
Sweeps at most one dead client first. An id in B:waiting without a record in B:rec, or
with a blocked job (so active: its entry in B:waiting was written around the library; an
active id without a blocked job cannot be told from a waiting one without a read of every
client's leases), is dropped from B:waiting and skipped (with a value in B:rec that is not
a record, written around the library, that value is dropped too); an id leaves B:waiting
only as its record is leased (the record stays in B:rec as it is: active, as it is not in
B:waiting). Commands per call, not per job: ZRANGE, one HMGET of B:rec, EXISTS of
B:blocked (and while it exists its HMGET), ZREM, one HSET of the leases.
]]
local function dequeue(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  local client = check_id(args[2], 'client id')
  local nonce = check_id(args[3], 'nonce')
  local limit = math.min(whole(args[4], 'limit', MAX_COUNT), MAX_DEQUEUE)
  local expiry_ms = whole(args[5], 'expiry ms', MAX_COUNT)
  local maxlen = whole(args[6], 'events maxlen', MAX_COUNT)
  local park = args[7] ~= nil and args[7] ~= '' and flag(args[7], 'park')
  local form = args[8]
  if form ~= nil and form ~= '' and form ~= 'rec' then
    invalid("reply must be 'rec' or '', got " .. shown(form))
  end
  local rec_reply = form == 'rec'
  if expiry_ms < 1 then
    invalid('expiry ms must be >= 1, got 0')
  end
  -- the call's first read; `fresh`: B holds no job and no mark (marked below: the call
  -- registers its client, so B is no longer fresh after it)
  local parked, fresh = guarded_exists(B, B .. ':parked')
  if parked == nil then
    return moving(B)
  end
  sweep_one(B, now, client, maxlen)
  if not keep_alive(B, now, client, expiry_ms) then
    return {2, ''}
  end
  if fresh then
    call('SET', B .. ':layout', '5')
  end
  local out = list()
  out[1], out[2] = 0, ''
  if limit > 0 then
    local ids = call('ZRANGE', B .. ':waiting', '-inf', int(now), 'BYSCORE', 'LIMIT', 0,
      limit)
    local leases = list()
    if #ids > 0 then
      -- their records, in one read (they stay where they are: a leased record is active as
      -- it is not in B:waiting); each is taken apart with plain find()s (rec_lease)
      local recs = call('HMGET', B .. ':rec', unpack(ids))
      -- an id with a blocked job is active (a blocked job waits only behind an active one):
      -- its entry in B:waiting, written around the library, is dropped and its record not
      -- leased a second time (one EXISTS per call; one HMGET while jobs are blocked)
      if call('EXISTS', B .. ':blocked') == 1 then
        local blocked = call('HMGET', B .. ':blocked', unpack(ids))
        for k = 1, #ids do
          if blocked[k] then
            recs[k] = false
          end
        end
      end
      local now_s = int(now)
      local taken, o, garbled = 0, 2, nil -- leases so far; the last index of out
      for k, id in ipairs(ids) do
        local v = recs[k]
        local run_at, retry, stall, timeout, trace, data, as_is = nil, nil, nil, nil, nil,
          nil, nil
        if v and rec_reply then -- (the record as it is, unless it must be built anew)
          as_is = rec_as_is(v)
          if as_is == false then
            run_at, retry, stall, timeout, trace, data = rec_lease(v)
          end
        elseif v then
          run_at, retry, stall, timeout, trace, data = rec_lease(v)
        end
        if run_at == nil and not as_is then
          -- a stray id without a record: only dropped from B:waiting (below); with a value
          -- that is not a record (written around the library), that value goes too (no
          -- job could ever run it, and the id is free for a dispatch again, as in 4.x)
          if v then
            garbled = garbled or list()
            garbled[#garbled + 1] = id
          end
        else
          taken = taken + 1
          local token = nonce .. '.' .. small(taken)
          leases[2 * taken - 1] = id
          leases[2 * taken] = token .. ' ' .. now_s -- (lease_line, inline)
          if rec_reply then
            if not as_is then -- numbers garbled or a trace too long: built anew, as read
              local job = rec_job(id, v)
              v = rec_pack(run_at, job.enqueued_at or '0', retry, stall, timeout,
                job.attempts, #trace > MAX_TRACE and '' or trace, data)
            end
            out[o + 1], out[o + 2], out[o + 3] = id, token, v
            o = o + 3
          else
            if #trace > MAX_TRACE then -- one written around the library: none (4.3.0)
              trace = ''
            end
            out[o + 1], out[o + 2], out[o + 3], out[o + 4] = id, token, data, run_at
            out[o + 5], out[o + 6], out[o + 7], out[o + 8] = retry, stall, timeout, trace
            o = o + 8
          end
        end
      end
      -- every record selected is leased: they leave B:waiting together
      call('ZREM', B .. ':waiting', unpack(ids))
      if garbled ~= nil then
        call('HDEL', B .. ':rec', unpack(garbled))
      end
      if #leases > 0 then
        call('HSET', B .. ':lease:' .. client, unpack(leases))
      end
    end
    if park and #leases / 2 < limit then
      call('HSET', B .. ':parked', client, int(limit - #leases / 2))
    elseif parked > 0 then -- (no B:parked before the call: no slots of this client to clear)
      call('HDEL', B .. ':parked', client)
    end
  end
  out[2] = next_run_at(B)
  return out
end

--[[ queasy_finish: jobs completed successfully.
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  client id
ARGV[3]  events maxlen
ARGV[4]  keep count: finished records kept (0: none; see Retention)
ARGV[5]  keep ms: how long finished records are kept
ARGV[6]  host of the client (free text, '' unknown), written into the records
ARGV[7]  notify '1'|'0': SPUBLISH B:done:<id> 'finished' for each job (the queue stores results)
ARGV[8..] quintuples: id, token, worker pid ('' or digits), started_at ('' or ms), result
          ('' none, else JSON: the handler's return value, kept in the record)
Returns: one code per job: 0 ok, 1 stale (lease lost; nothing changed).
Refuses: a result that is not JSON, more than MAX_ACKS (1000) jobs (INVALID, nothing written).
Emits:   event outcome=finished. A blocked job with the same id becomes waiting. The end
         of a schedule's occurrence is noted in B:schedule (its next: queasy_schedule).
Cost:    per job of no result and no earlier failed attempt, its event's XADD only; per call
         the guard's EXISTS, HMGETs of the lease hash and of B:rec, HDELs of the lease hash,
         B:rec (and B:err, for jobs leased before), the DEL of earlier kept records, the
         retention's and the stats'.
]]
local function finish(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  local client, maxlen = check_acks(args, 8, 5, 2, 'queasy_finish')
  local ends = check_ends(args)
  for i = 8, #args, 5 do
    if args[i + 4] ~= '' then -- results: checked like job data (the strict decoder is set once)
      strict_json(function()
        for k = i, #args, 5 do
          if args[k + 4] ~= '' then
            check_json(args[k + 4], 'result', (k - 3) / 5)
          end
        end
      end)
      break
    end
  end
  local found = guarded_exists(B, B .. ':blocked') -- the call's first read
  if found == nil then
    return moving(B)
  end
  local any_blocked = found > 0
  local keep = ends.count > 0 and ends.ms > 0
  local ended = int(now)
  local scored, done, wholes, erred = list(), list(), nil, {}
  local out = ends_batch()
  local events, host, pending = B .. ':events', ends.host, nil
  local codes, taken = each_leased(B, client, args, 8, 5, function(job, i)
    local result, line, failed_before = args[i + 4], nil, nil
    if job.counts then
      -- a lease of 4.1.0 (lease_of): its event and its end as outcome_event and ending write
      -- them, built here in one concatenation each. The event is appended when the next one
      -- is (without MAXLEN), the call's last after the loop, with MAXLEN (~): the stream is
      -- capped once per call
      local pid, started = args[i + 2], args[i + 3]
      pid, started = pid == '' and '-' or pid, started == '' and '-' or started
      if maxlen > 0 then
        if pending then
          call('XADD', events, '*', 'event', pending)
        end
        pending = 'finished ' .. job.id .. ' ' .. ended .. ' ' .. started .. ' ' .. pid .. ' '
          .. job.counts .. ' ' .. client
      end
      line = 'finished ' .. ended .. ' ' .. started .. ' ' .. pid .. ' ' .. job.attempts .. ' '
        .. job.counts .. ' ' .. client .. ' ' .. host
      failed_before = string.sub(job.counts, -6) ~= ' 0 0 0' -- "... <retry> <stall> <timeout>"
    else
      if pending then -- the events stay in the order of the acks
        call('XADD', events, '*', 'event', pending)
        pending = nil
      end
      local at, counts = outcome_event(B, maxlen, ended, 'finished', job, args[i + 2], args[i + 3])
      line = ending('finished', at, counts, job.attempts, host)
      failed_before = job.retry_count ~= 0 or job.stall_count ~= 0 or job.timeout_count ~= 0
    end
    if keep and (result ~= '' or failed_before) then
      -- kept whole (after the loop: its last error is read for all in one HMGET): the
      -- record, its lease's fields, and the result if any
      local extra = {'leased_at', leased_at(job), 'attempts', job.attempts}
      if result ~= '' then
        extra[5], extra[6] = 'result', result
      end
      wholes = wholes or {}
      wholes[#wholes + 1] = {job, extra}
    else
      end_record(B, job.id, keep, nil, out)
    end
    if job.attempts ~= '1' then -- (a last error is written at a requeue, which counts the
      erred[#erred + 1] = job.id -- lease in attempts: a job leased once has none)
    end
    scored[#scored + 1] = ended
    scored[#scored + 1] = job.id
    done[#done + 1] = job.id
    done[#done + 1] = line
    if job.id == SCHEDULE_ID then
      schedule_ended(B, job.id, now, 'finished', true)
    end
    if ends.notify then
      call('SPUBLISH', B .. ':done:' .. job.id, 'finished')
    end
  end, nil, true)
  if pending then -- (MAXLEN ~, as each XADD of outcome_event)
    call('XADD', events, 'MAXLEN', '~', maxlen, '*', 'event', pending)
  end
  if wholes ~= nil then
    local wids = {}
    for n, w in ipairs(wholes) do
      wids[n] = w[1].id
    end
    local errs = call('HMGET', B .. ':err', unpack(wids))
    for n, w in ipairs(wholes) do
      end_record(B, w[1].id, keep, ended_fields(w[1].id, w[1].v, errs[n], w[2]), out)
    end
    write_ended(out)
  end
  drop_living(B, taken, erred)
  unended(B, out)
  if any_blocked then -- (after the records left B:rec: a promoted job takes its id's place)
    for _, id in ipairs(taken) do
      promote(B, id, true)
    end
  end
  -- the records of the trimmed ends join `gone`: one DEL for all (nothing reads them between)
  retain(B, 'finished', now, ends.count, ends.ms, scored, done, out.gone)
  if #out.gone > 0 then
    call('DEL', unpack(out.gone))
  end
  tally(B, 'finished', now, #scored / 2)
  return codes
end

--[[ queasy_retry: put active jobs back in waiting at a given time.
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  client id
ARGV[3]  events maxlen
ARGV[4..] groups of 9: id, token, run_at, kind, worker pid, started_at, error name,
          error message, traceback (free text, '' none)
          run_at: ms since the epoch, or '+<ms>': that long after now (the server's clock)
          kind: 'retry' (retry_count + 1), 'timeout' (timeout_count + 1),
                'stall' (stall_count + 1), 'release' (no count: shutdown hand-back),
                'return' (no count, no event: a pushed job the client had no room for;
                its parked slots are cleared and B:wake is SPUBLISHed)
Returns: one code per job: 0 ok, 1 stale (also for an unknown kind: the lease is kept).
Refuses: a run_at not integer ms in 0..MAX_MS nor '+' and integer ms, error text over
         MAX_TEXT bytes, more than MAX_ACKS (1000) jobs (INVALID, nothing written). now + delay is capped at MAX_MS.
Emits:   event outcome=retried|timed_out|stalled|released (none for 'return'). A blocked
         job's update is applied to the retried job (data, run_at, counts per its flags).
         The error of a retry, timeout or stall becomes the job's last error.
]]
local RETRY_KINDS = {
  retry = {'retry_count', 'retried', 'retriable'},
  timeout = {'timeout_count', 'timed_out', 'stall'},
  stall = {'stall_count', 'stalled', 'stall'},
  release = {nil, 'released', ''},
  ['return'] = {nil, nil, ''},
}
local function retry(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  local client, maxlen = check_acks(args, 4, 9, 4, 'queasy_retry')
  local run_ats = {}
  for i = 4, #args, 9 do
    run_ats[i] = run_at_from(args[i + 2], now, 'retry run_at')
    check_error(args, i + 6, (i + 5) / 9)
  end
  local out = requeue_batch()
  local blocked = nil -- B:blocked's value of each id of the call (false: none), read once
  local codes = each_leased(B, client, args, 4, 9, function(job, i)
    if blocked == nil then
      local ids = {}
      for k = 4, #args, 9 do
        ids[#ids + 1] = args[k]
      end
      blocked = {}
      for n, bv in ipairs(call('HMGET', B .. ':blocked', unpack(ids))) do
        if bv then
          blocked[ids[n]] = bv
        end
      end
    end
    local kind = RETRY_KINDS[args[i + 3]]
    if kind[1] ~= nil then
      job[kind[1]] = job[kind[1]] + 1
    end
    local err = {name = args[i + 6], kind = kind[3], message = args[i + 7],
      traceback = args[i + 8]}
    if kind[2] ~= nil then
      outcome_event(B, maxlen, int(now), kind[2], job, args[i + 4], args[i + 5], err)
    end
    requeue(job, run_ats[i], kind[3] ~= '' and err or nil, now, blocked[job.id], out)
    if kind[2] == nil then
      call('HDEL', B .. ':parked', client)
      call('SPUBLISH', B .. ':wake', int(job.run_at))
    end
  end, function(i)
    return RETRY_KINDS[args[i + 3]] ~= nil -- an unknown kind must not consume the lease
  end)
  requeued(B, out)
  return codes
end

-- The fail jobs of a queasy_fail call (the groups at ARGV `at`: fail job id at i + 2, its
-- data at i + 3) enter the fail queue F, waiting now, in one HMGET, HSET and ZADD of F per
-- call; SPUBLISH F:wake. A fail job id that has a job in F already (written around the
-- library: the supervisor makes a new id per failure) is as library 4.x left it: a
-- waiting one gets the new data and run_at (its counts, attempts and trace stay); an active
-- one gets a blocked job with the new record behind it (no update of the active one).
local function dispatch_fails(F, now, args, at)
  local now_s = int(now)
  local fids = {}
  for n, i in ipairs(at) do
    fids[n] = args[i + 2]
  end
  local have = call('HMGET', F .. ':rec', unpack(fids))
  local recs, scored, blocks = {}, {}, {}
  for n, i in ipairs(at) do
    local fid, v = fids[n], have[n]
    local old = v and rec_job(fid, v)
    if old and call('ZSCORE', F .. ':waiting', fid) == false then -- active
      blocks[#blocks + 1] = fid
      blocks[#blocks + 1] = blocked_pack(false, false, 'clamp', nil, nil,
        rec_pack(now_s, now_s, '0', '0', '0', '0', '', args[i + 3]))
    else
      recs[#recs + 1] = fid
      if old then
        recs[#recs + 1] = rec_pack(now_s, now_s, int(old.retry_count), int(old.stall_count),
          int(old.timeout_count), old.attempts, old.trace, args[i + 3])
      else
        recs[#recs + 1] = rec_pack(now_s, now_s, '0', '0', '0', '0', '', args[i + 3])
      end
      scored[#scored + 1] = now_s
      scored[#scored + 1] = fid
    end
  end
  if #recs > 0 then
    call('HSET', F .. ':rec', unpack(recs))
    call('ZADD', F .. ':waiting', unpack(scored))
  end
  if #blocks > 0 then
    call('HSET', F .. ':blocked', unpack(blocks))
  end
  call('SPUBLISH', F .. ':wake', now_s)
end

--[[ queasy_fail: jobs failed for good; each fail job is dispatched in the same call.
KEYS[1]  B
KEYS[2]  F: base key of the fail queue (same hash tag), or absent when there is no fail handler
ARGV[1]  now (ms or '')
ARGV[2]  client id
ARGV[3]  events maxlen (of B)
ARGV[4]  keep count: failed records kept (0: none; see Retention)
ARGV[5]  keep ms: how long failed records are kept
ARGV[6]  host of the client (free text, '' unknown), written into the records
ARGV[7]  notify '1'|'0': SPUBLISH B:done:<id> 'failed' for each job (the queue stores results)
ARGV[8..] groups of 10: id, token, fail job id (the id rules; '' without F), fail job data
          (JSON built by the supervisor from the job's record; '' without F), worker pid,
          started_at, error name, error kind, error message, traceback (free text)
Returns: one code per job: 0 ok, 1 stale (nothing changed, no fail job).
Refuses: with F, a fail job id that breaks the id rules; error text over MAX_TEXT bytes;
         more than MAX_ACKS (1000) jobs (INVALID, nothing written).
Emits:   event outcome=failed on B; SPUBLISH F:wake. The error is kept in the job's record. The
         end of a schedule's occurrence is noted in B:schedule (its next: queasy_schedule).
]]
local function fail(keys, args)
  local B, F = keys[1], keys[2]
  local now = clock(args[1])
  local client, maxlen = check_acks(args, 8, 10, 4, 'queasy_fail')
  local ends = check_ends(args)
  for i = 8, #args, 10 do
    local n = (i + 2) / 10
    if F ~= nil then
      check_id(args[i + 2], 'fail job id', n)
    end
    text(args[i + 6], 'error name', n)
    text(args[i + 7], 'error kind', n)
    text(args[i + 8], 'error message', n)
    text(args[i + 9], 'traceback', n)
  end
  local any_blocked = call('EXISTS', B .. ':blocked') == 1
  local keep = ends.count > 0 and ends.ms > 0
  local ended = int(now)
  local scored, done, fails = {}, {}, {}
  local out = ends_batch()
  local codes, taken = each_leased(B, client, args, 8, 10, function(job, i)
    local err = {name = args[i + 6], kind = args[i + 7], message = args[i + 8],
      traceback = args[i + 9]}
    local at, counts = outcome_event(B, maxlen, ended, 'failed', job, args[i + 4], args[i + 5], err)
    -- kept whole: the record with this error (its last error, replaced: not read), its lease
    end_record(B, job.id, keep, keep and ended_fields(job.id, job.v, false, {'error_name',
      err.name, 'error_kind', err.kind, 'error_message', err.message, 'traceback',
      err.traceback, 'error_at', ended, 'leased_at', leased_at(job), 'attempts',
      job.attempts}) or nil, out)
    scored[#scored + 1] = ended
    scored[#scored + 1] = job.id
    done[#done + 1] = job.id
    done[#done + 1] = ending('failed', at, counts, job.attempts, ends.host)
    schedule_ended(B, job.id, now, 'failed', true)
    if ends.notify then
      call('SPUBLISH', B .. ':done:' .. job.id, 'failed')
    end
    if F ~= nil then
      fails[#fails + 1] = i
    end
  end)
  write_ended(out)
  drop_living(B, taken)
  unended(B, out)
  if #out.gone > 0 then
    call('DEL', unpack(out.gone))
  end
  if any_blocked then -- (after the records left B:rec: a promoted job takes its id's place)
    for _, id in ipairs(taken) do
      promote(B, id, true)
    end
  end
  if #fails > 0 then
    dispatch_fails(F, now, args, fails)
  end
  retain(B, 'failed', now, ends.count, ends.ms, scored, done)
  tally(B, 'failed', now, #scored / 2)
  return codes
end

-- ---------------------------------------------------------------- clients: bump, leave, unpark
-- (a sweep of one dead client runs inside dequeue and bump: sweep_one above)

--[[ queasy_bump: heartbeat of a client.
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  client id (the id rules)
ARGV[3]  expiry ms (>= 1)
ARGV[4]  events maxlen (for events of a sweep)
Returns: 0 ok, 2 when this client was already swept (it must drop its jobs and start over).
Sweeps at most one dead client.
]]
local function bump(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  local client = check_id(args[2], 'client id')
  local expiry_ms = whole(args[3], 'expiry ms', MAX_COUNT)
  local maxlen = whole(args[4], 'events maxlen', MAX_COUNT)
  if expiry_ms < 1 then
    invalid('expiry ms must be >= 1, got 0')
  end
  sweep_one(B, now, client, maxlen)
  if not keep_alive(B, now, client, expiry_ms) then
    return 2
  end
  return 0
end

--[[ queasy_leave: a client stops listening (after it released its jobs).
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  client id
Returns: the number of leases it still held (they are kept, and swept at expiry).
Its parked slots are cleared.
]]
local function leave(keys, args)
  local B = keys[1]
  local client = check_id(args[2], 'client id')
  call('HDEL', B .. ':parked', client)
  local held = call('HLEN', B .. ':lease:' .. client)
  if held == 0 then
    call('ZREM', B .. ':expiry', client)
    call('ZREM', B .. ':fresh', client)
  end
  return held
end

--[[ queasy_unpark: a client stops taking pushed jobs (it shuts down, or reconciles).
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  client id (the id rules)
ARGV[3]  mark (the id rules: no newline), SPUBLISHed on B:push:<client> after clearing, so
         the client knows every job pushed to it before has arrived once the mark has
Returns: {1 if it had parked slots else 0, receivers of the mark}. No job is pushed to it
         after this (until it parks again).
]]
local function unpark(keys, args)
  local B = keys[1]
  local client = check_id(args[2], 'client id')
  local mark = check_id(args[3], 'mark')
  local had = call('HDEL', B .. ':parked', client)
  return {had, call('SPUBLISH', B .. ':push:' .. client, mark)}
end

-- ---------------------------------------------------------------- schedules

-- A schedule's text: 1-200 bytes, no control character (spaces allowed).
local function check_spec(arg)
  if type(arg) ~= 'string' or arg == '' or #arg > MAX_SPEC
      or string.find(arg, '[%z\1-\31\127]') then
    invalid('spec must be 1-' .. MAX_SPEC .. ' characters without control characters, got '
      .. shown(arg))
  end
  return arg
end

-- The data of the occurrence for fire time `fire_at` (ms): {"fire_at": <epoch seconds>}.
local function fire_data(fire_at)
  return '{"fire_at":' .. int(math.floor(fire_at / 1000)) .. '.'
    .. string.format('%03d', fire_at % 1000) .. '}'
end

-- The occurrence's state: 'active' (a blocked copy may wait behind it), 'waiting' (waiting or
-- delayed), or '' when there is none.
local function occurrence_state(B)
  if call('HEXISTS', B .. ':rec', SCHEDULE_ID) == 0 then
    return ''
  elseif call('ZSCORE', B .. ':waiting', SCHEDULE_ID) == false then
    return 'active'
  end
  return 'waiting'
end

--[[ queasy_schedule: keep a queue's schedule going. Its one occurrence (job id SCHEDULE_ID,
data {"fire_at": seconds}, run_at its fire time) is created for the next fire time when there
is none (the last one ended), or a pending one that never ran is moved (the schedule changed,
or catch-up). Fire times only grow, so several supervisors never create one twice.
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  spec: the schedule's text (1-200 bytes, no control character), stored for status
ARGV[3]  seen: B:schedule's fire_at (ms) that the caller computed from, '' when it saw none
ARGV[4]  create_at: fire time (ms) of the occurrence to create if there is none; > seen
ARGV[5]  retime_at: fire time (ms) to move the pending occurrence to, or '': only one waiting
         with fire time `seen` that never ran (run_at = fire time, counts 0); it must be later
         than the last fire time that ended
ARGV[6]  skipped if created: fire times that creating at create_at passes over (catch-up),
         added to B:schedule's skipped (0 ..= MAX_COUNT)
ARGV[7]  skipped if moved: fire times that moving to retime_at passes over (the pending one's
         included), added to B:schedule's skipped (0 ..= MAX_COUNT)
Returns: {code, fire_at, spec, last_fire_at, state} after the call: code 0 nothing to do (the
         occurrence exists and stays), 1 stale (B:schedule's fire_at is not `seen`: nothing
         written; compute again from the fire_at returned), 2 created, 3 moved; fire_at,
         spec, last_fire_at of B:schedule ('' when unset); state: 'active', 'waiting' or ''.
Refuses: (INVALID, nothing written) a bad spec, a time not integer ms in 0..MAX_MS, create_at
         not later than seen; from a caller that is not stale, retime_at not later than the
         last fire time that ended.
Emits:   SPUBLISH B:wake <fire time> when it creates or moves the occurrence.
]]
local function schedule(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  local spec = check_spec(args[2])
  local seen = nil
  if args[3] ~= '' then
    seen = ms(args[3], 'seen')
  end
  local create_at = ms(args[4], 'create_at')
  local retime_at = nil
  if args[5] ~= '' then
    retime_at = ms(args[5], 'retime_at')
  end
  local skipped_create = whole(args[6], 'skipped if created', MAX_COUNT)
  local skipped_move = whole(args[7], 'skipped if moved', MAX_COUNT)
  if seen ~= nil and create_at <= seen then
    invalid('create_at must be later than seen, got ' .. shown(args[4]))
  end
  local skey = B .. ':schedule'
  local s = call('HMGET', skey, 'fire_at', 'spec', 'last_fire_at', 'skipped')
  local fire_at, last_fire_at = tonumber(s[1]), tonumber(s[3])
  local state = occurrence_state(B)
  local function reply(code)
    local row = call('HMGET', skey, 'fire_at', 'spec', 'last_fire_at')
    return {code, row[1] or '', row[2] or '', row[3] or '', occurrence_state(B)}
  end
  if fire_at ~= seen then -- first: a caller that computed from an old fire time learns it
    return reply(1)
  end
  if retime_at ~= nil and last_fire_at ~= nil and retime_at <= last_fire_at then
    invalid('retime_at must be later than the last fire time that ended, got '
      .. shown(args[5]))
  end
  local at, skipped, job = nil, 0, nil
  if state == '' then
    at, skipped = create_at, skipped_create
  elseif retime_at ~= nil and state == 'waiting' then
    job = rec_job(SCHEDULE_ID, call('HGET', B .. ':rec', SCHEDULE_ID))
    if job and job.run_at == fire_at and job.retry_count == 0 and job.stall_count == 0
        and job.timeout_count == 0 then
      at, skipped = retime_at, skipped_move
    end
  end
  if at == nil then
    return reply(0)
  end
  if state == '' then -- a new record (no trace)
    call('HSET', B .. ':rec', SCHEDULE_ID, rec_pack(int(at), int(now), '0', '0', '0', '0', '',
      fire_data(at)))
  else -- the pending one moved: its enqueued_at, attempts and trace stay
    job.data, job.run_at = fire_data(at), at
    call('HSET', B .. ':rec', SCHEDULE_ID, rec_of(job))
  end
  call('ZADD', B .. ':waiting', int(at), SCHEDULE_ID)
  call('HSET', skey, 'spec', spec, 'fire_at', int(at),
    'skipped', int(math.min(MAX_COUNT, field_int(s[4], MAX_COUNT) + skipped)))
  call('SPUBLISH', B .. ':wake', int(at))
  if state == '' then
    return reply(2)
  end
  return reply(3)
end

--[[ queasy_unschedule: drop a queue's schedule (B:schedule) once no occurrence of it exists, so
a schedule removed from every supervisor's config leaves no trace: status and schedules() no
longer list it, and the id SCHEDULE_ID is a plain id again (4.4.0). A supervisor still listening
with the schedule creates it again at its next check.
KEYS[1]  B
ARGV[1]  now (ms or '')
Returns: {code, state}: code 0 B has no schedule, 1 dropped, 2 kept (nothing written) as its
         occurrence exists; state: 'active', 'waiting' or '' (occurrence_state).
]]
local function unschedule(keys, args)
  local B = keys[1]
  clock(args[1])
  local skey = B .. ':schedule'
  if call('EXISTS', skey) == 0 then
    return {0, occurrence_state(B)}
  end
  local state = occurrence_state(B)
  if state ~= '' then
    return {2, state}
  end
  call('DEL', skey)
  return {1, ''}
end

-- ---------------------------------------------------------------- reads: no writes

local ZERO_FIELDS = {'retry_count', 'stall_count', 'timeout_count', 'attempts'}
local HIDDEN = {token = true, u_data = true, u_run_at = true, u_reset = true, u_lo = true,
  u_hi = true}
-- number fields, read as the library reads them (field_int: garbage is 0); those marked
-- false may also be '' (unknown)
local NUMBERS = {run_at = true, retry_count = true, stall_count = true, timeout_count = true,
  attempts = true, enqueued_at = true, leased_at = true, ended_at = true, error_at = true,
  started_at = false, pid = false}

-- The fields of record `key` as {field, value, ...}, without the lease token and the update
-- fields of a blocked job (and without data unless `with_data`); nil when there is none.
local function describe(key, with_data, ending_, id)
  local flat = call('HGETALL', key)
  local out, seen = {}, {}
  if ending_ then -- the end of an ended job (B:ends), as separate fields, first
    out[1], out[2], seen.id = 'id', id, true
    local i = 0
    for at, word in string.gmatch(ending_, '()(%S+)') do
      i = i + 1
      if i == #END_FIELDS then -- the host is the rest of the line (it may hold spaces)
        word = string.sub(ending_, at)
      end
      out[#out + 1] = END_FIELDS[i]
      out[#out + 1] = word
      seen[END_FIELDS[i]] = true
      if i == #END_FIELDS then
        break
      end
    end
  elseif #flat == 0 then
    return nil
  end
  for i = 1, #flat, 2 do
    local name, value = flat[i], flat[i + 1]
    if not HIDDEN[name] and not seen[name] and (with_data or name ~= 'data') then
      out[#out + 1] = name
      out[#out + 1] = value
      seen[name] = true
    end
  end
  for _, name in ipairs(ZERO_FIELDS) do -- absent: 0 (library 4.0.0 writes no zero count)
    if not seen[name] then
      out[#out + 1] = name
      out[#out + 1] = '0'
    end
  end
  for i = 1, #out, 2 do
    local kind, value = NUMBERS[out[i]], out[i + 1]
    if value == '-' then
      out[i + 1] = ''
    elseif kind or (kind == false and value ~= '') then
      out[i + 1] = int(field_int(value, MAX_MS))
    end
  end
  return out
end

-- The fields of the living record `v` of `id` (a record string of B:rec, see "records (5.0
-- layout)") as library 4.4.0's describe gave those of its hash: id, data (with `with_data`),
-- run_at, enqueued_at (absent when unknown), trace (absent when none), the counts, attempts,
-- and its last error (`err`: its value in B:err, a cjson string, or false) as error_name,
-- error_kind, error_message, traceback, error_at; nil for a value that is not a record
-- (written around the library).
local function describe_rec(id, v, err, with_data)
  local job = rec_job(id, v)
  if job == nil then
    return nil
  end
  local out = {'id', id}
  if with_data then
    out[3], out[4] = 'data', job.data
  end
  out[#out + 1], out[#out + 2] = 'run_at', int(job.run_at)
  if job.enqueued_at then
    out[#out + 1], out[#out + 2] = 'enqueued_at', int(field_int(job.enqueued_at, MAX_MS))
  end
  if job.trace ~= '' then
    out[#out + 1], out[#out + 2] = 'trace', job.trace
  end
  out[#out + 1], out[#out + 2] = 'retry_count', int(job.retry_count)
  out[#out + 1], out[#out + 2] = 'stall_count', int(job.stall_count)
  out[#out + 1], out[#out + 2] = 'timeout_count', int(job.timeout_count)
  out[#out + 1], out[#out + 2] = 'attempts', job.attempts
  local ok, e = pcall(cjson.decode, err or '')
  if err and ok and type(e) == 'table' then
    local function s(x) -- (a value garbled around the library: '')
      return type(x) == 'string' and x or ''
    end
    out[#out + 1], out[#out + 2] = 'error_name', s(e.name)
    out[#out + 1], out[#out + 2] = 'error_kind', s(e.kind)
    out[#out + 1], out[#out + 2] = 'error_message', s(e.message)
    out[#out + 1], out[#out + 2] = 'traceback', s(e.traceback)
    out[#out + 1], out[#out + 2] = 'error_at', int(field_int(e.at, MAX_MS))
  end
  return out
end

local function lookup(fields, name)
  for i = 1, #fields, 2 do
    if fields[i] == name then
      return fields[i + 1]
    end
  end
  return nil
end

-- The fields of the active record `v` of `id` (a record string of B:rec; `err` its last
-- error or false: as describe_rec) with its lease (in B:lease:<client>): client, leased_at,
-- and attempts counting this lease. `client` and `held` (its value in B:lease:<client>) when
-- the caller knows them, else the live clients' leases are looked up; a record no client
-- holds (written around the library) shows without them, as 4.4.0 showed it.
local function describe_active(B, id, with_data, v, err, client, held)
  local rec = describe_rec(id, v, err, with_data)
  if rec == nil then
    return nil
  end
  if client == nil then
    for _, c in ipairs(call('ZRANGE', B .. ':expiry', 0, -1)) do
      held = call('HGET', B .. ':lease:' .. c, id)
      if held then
        client = c
        break
      end
    end
    if client == nil then
      return rec
    end
  end
  for i = 1, #rec, 2 do
    if rec[i] == 'attempts' then
      rec[i + 1] = int(field_int(rec[i + 1], MAX_MS) + 1)
    end
  end
  rec[#rec + 1] = 'client'
  rec[#rec + 1] = client
  rec[#rec + 1] = 'leased_at'
  rec[#rec + 1] = int(field_int(string.match(held, ' (%S*)$'), MAX_MS))
  return rec
end

-- The record string of a value of the hash B:blocked ("<u_data> <u_reset> <u_run_at> <u_lo>
-- <u_hi>\t<record string>"), or nil.
local function blocked_record(b)
  local tab = b and find(b, '\t', 1, true)
  return tab and string.sub(b, tab + 1) or nil
end

-- {state, fields} of the living record of `id` (B:rec: active, or waiting or delayed by its
-- run_at, as 4.4.0 told them; a blocked one behind an active one shows the active one), else
-- of the blocked one without an active one (written around the library), or nil.
local function living(B, id, now, with_data)
  local v = call('HGET', B .. ':rec', id)
  if v then
    local err = call('HGET', B .. ':err', id)
    if call('ZSCORE', B .. ':waiting', id) == false then
      local rec = describe_active(B, id, with_data, v, err)
      if rec ~= nil then
        return {'active', rec}
      end
    else
      local rec = describe_rec(id, v, err, with_data)
      if rec ~= nil then
        return {field_int(lookup(rec, 'run_at'), MAX_MS) > now and 'delayed' or 'waiting', rec}
      end
    end
  end
  local rec = describe_rec(id, blocked_record(call('HGET', B .. ':blocked', id)), false,
    with_data)
  return rec and {'blocked', rec} or nil
end

-- {state, fields} of an ended record `key` (its state field), or nil.
local function ended(B, id, with_data)
  local done = call('HGET', B .. ':ends', id)
  if not end_state(done) then
    return nil
  end
  return {end_state(done), describe(B .. ':ended:' .. id, with_data, done, id)}
end

--[[ queasy_get_job: one job's state and record (read-only).
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  id
Returns: nil, or {state, {field, value, ...}}: the active record if there is one, else the
         waiting one, else the record of its end while the retention keeps it.
         state: 'active' | 'blocked' | 'waiting' | 'delayed' | 'finished' | 'failed' |
         'cancelled'. Fields: those of the key layout (not the lease token, nor a blocked
         job's update fields).
]]
local function get_job(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  local id = args[2]
  return living(B, id, now, true) or ended(B, id, true)
end

-- Whether `a` comes before `b` as a sorted set orders the members of one score (byte by
-- byte, memcmp; Lua's `<` follows the server's collation locale).
local function bytes_before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return #a < #b
end

-- The rank where a page of the sorted set `zkey` starts (its listing holds the ranks from
-- `from`, in reverse order with `rev`) after `cursor`: '0' the first page; '<score>.<id>' the
-- last job the page before listed, with its score (5.1.1): the page goes on after that
-- place in the set's order, whether that job is still there or not, so jobs taken from
-- the head of the listing meanwhile (a supervisor's dequeues) or new ones before it (new
-- ends, newest first) do not move it over jobs that did not change, nor back over some
-- again; '<n>' an offset from `from`, 5.1.0's cursor (still taken). The place among the
-- jobs of that score is found by a binary search of them (a ZRANGE of one per step: no
-- command beyond those of the README's ACL line).
local function page_start(zkey, from, cursor, rev)
  if cursor == '0' then
    return from
  end
  local score, id = string.match(cursor, '^(%d+)%.(.+)$')
  if score == nil then
    return from + whole(cursor, 'cursor', MAX_MS)
  elseif #score > 15 or #id > 4 * MAX_ID_CHARS then
    invalid('cursor must be 0 or the one a page returned, got ' .. shown(cursor))
  end
  local low = rev and call('ZCOUNT', zkey, '(' .. score, '+inf')
    or call('ZCOUNT', zkey, '-inf', '(' .. score)
  local high = low + call('ZCOUNT', zkey, score, score)
  while low < high do -- the first of that score that comes after `id` in the listing
    local mid = math.floor((low + high) / 2)
    local m = rev and call('ZRANGE', zkey, mid, mid, 'REV') or call('ZRANGE', zkey, mid, mid)
    m = m[1]
    if rev and bytes_before(m, id) or not rev and bytes_before(id, m) then
      high = mid
    else
      low = mid + 1
    end
  end
  return math.max(from, low)
end

--[[ queasy_jobs: one page of the jobs of a state (read-only: each call bounded; a listing
of the whole queue is a loop of calls that hands on the cursor).
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  state: 'waiting' (ready now) | 'delayed' | 'blocked' | 'active' | 'finished' |
         'failed' | 'cancelled'
ARGV[3]  cursor: '0' for the first page, then the one the page before returned (5.1.1: of
         active jobs '<client>.<n>', the client to go on with and its HSCAN cursor; of
         waiting, delayed and ended ones '<score>.<id>', the last job listed: page_start)
ARGV[4]  limit: jobs per page (1..MAX_PAGE; a blocked or active page may hold a few more)
ARGV[5]  with data '1'|'0': include each record's data
Returns: {next cursor ('0' after the last page), {state, {field, value, ...}}, ...}:
         waiting and delayed by run_at, finished, failed and cancelled newest first, blocked
         in scan order, active by client id (each client's leases in scan order: a
         heartbeat, which moves its client in B:expiry, does not move its jobs in the
         listing). A page may miss or repeat a job that changed state since the page before;
         jobs taken from the head of a listing, or new ones before the cursor, do not make
         the next page pass over others or list some again.
Refuses: an unknown state, a malformed cursor, a limit out of range.
]]
local function jobs(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  local state = args[2]
  local cursor = args[3]
  local limit = page(args[4], 'limit')
  local with_data = flag(args[5], 'with data')
  local out = {'0'}
  if state == 'active' then
    -- the clients in the order of their ids, and the cursor names the client to go on with
    -- (5.1.1): B:expiry's order is by expiry, which every heartbeat changes, and a cursor
    -- of a rank in it (5.1.0's '<n>.<n>') listed one client's jobs twice and another's never
    local holder, c = string.match(cursor or '', '^(.+)%.(%d+)$')
    if cursor == '0' then
      holder, c = '', '0'
    elseif holder == nil or #holder > 4 * MAX_ID_CHARS or #c > 20 then -- (bytes)
      invalid('cursor of active jobs must be 0 or <client>.<n>, got ' .. shown(cursor))
    end
    local clients = call('ZRANGE', B .. ':expiry', 0, -1)
    table.sort(clients, bytes_before) -- (not `<`: the server's collation locale)
    local i = 1
    while i <= #clients and bytes_before(clients[i], holder) do
      i = i + 1
    end
    if clients[i] ~= holder then -- (that client left since: the next one, from its start)
      c = '0'
    end
    local calls = 0
    while i <= #clients and #out - 1 < limit and calls < 10 do
      calls = calls + 1
      local scan = call('HSCAN', B .. ':lease:' .. clients[i], c, 'COUNT', limit)
      local ids = {}
      for k = 1, #scan[2], 2 do
        ids[#ids + 1] = scan[2][k]
      end
      local recs = #ids > 0 and call('HMGET', B .. ':rec', unpack(ids)) or {}
      local errs = #ids > 0 and call('HMGET', B .. ':err', unpack(ids)) or {}
      for k, id in ipairs(ids) do
        local rec = recs[k] and describe_active(B, id, with_data, recs[k], errs[k], clients[i],
          scan[2][2 * k])
        if rec then
          out[#out + 1] = {'active', rec}
        end
      end
      c = scan[1]
      if c == '0' then
        i = i + 1
      end
    end
    if i <= #clients then
      out[1] = clients[i] .. '.' .. c
    end
    return out
  end
  if state == 'blocked' then
    whole(cursor, 'cursor', MAX_MS)
    local scan = call('HSCAN', B .. ':blocked', cursor, 'COUNT', limit)
    out[1] = scan[1]
    for k = 1, #scan[2], 2 do
      local rec = describe_rec(scan[2][k], blocked_record(scan[2][k + 1]), false, with_data)
      if rec ~= nil then
        out[#out + 1] = {'blocked', rec}
      end
    end
    return out
  end
  local zkey, from, total, rev
  if state == 'waiting' or state == 'delayed' then
    zkey = B .. ':waiting'
    local ready = call('ZCOUNT', zkey, '-inf', int(now))
    if state == 'waiting' then
      from, total = 0, ready
    else
      from, total = ready, call('ZCARD', zkey)
    end
  elseif END_STATES[state] then
    zkey, rev = B .. ':' .. state, true
    from, total = 0, call('ZCARD', zkey)
  else
    invalid('state must be waiting, delayed, blocked, active, finished, failed or cancelled, '
      .. 'got ' .. shown(state))
  end
  local first = page_start(zkey, from, cursor, rev)
  local read = {}
  if first < total then
    local last = math.min(first + limit, total) - 1
    read = rev and call('ZRANGE', zkey, first, last, 'REV', 'WITHSCORES')
      or call('ZRANGE', zkey, first, last, 'WITHSCORES')
  end
  local ids = {}
  for k = 1, #read, 2 do
    ids[#ids + 1] = read[k]
  end
  if rev then
    for _, id in ipairs(ids) do
      local rec = ended(B, id, with_data)
      if rec ~= nil and rec[1] == state then -- an id that ended again since: not this state
        out[#out + 1] = rec
      end
    end
  elseif #ids > 0 then
    local recs = call('HMGET', B .. ':rec', unpack(ids))
    local errs = call('HMGET', B .. ':err', unpack(ids))
    for k, id in ipairs(ids) do
      local rec = describe_rec(id, recs[k], errs[k], with_data)
      if rec ~= nil then
        out[#out + 1] = {state, rec}
      end
    end
  end
  if first + #ids < total then -- the last job listed (a score written around the library
    local score = read[#read] -- that is no ms: an offset, 5.1.0's cursor)
    out[1] = string.match(score, '^%d+$') and #score <= 15 and (score .. '.' .. ids[#ids])
      or int(first + #ids - from)
  end
  return out
end

--[[ queasy_counts: jobs per state, and how many ended (read-only).
KEYS[1]  B
ARGV[1]  now (ms or '')
Returns: {waiting, delayed, blocked, active, finished, failed, finished_last_minute,
          failed_last_minute, finished_last_hour, failed_last_hour}: finished and failed are
          totals since the last reset of B:stats; the last minute and hour are estimated from
          per-minute counts (the oldest minute weighed by the part of it still in the window).
]]
local function counts(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  -- every lease holder is in B:expiry (a swept client's leases are gone with it)
  local active = 0
  for _, client in ipairs(call('ZRANGE', B .. ':expiry', 0, -1)) do
    active = active + call('HLEN', B .. ':lease:' .. client)
  end
  local out = {
    call('ZCOUNT', B .. ':waiting', '-inf', int(now)),
    call('ZCOUNT', B .. ':waiting', '(' .. int(now), '+inf'),
    call('HLEN', B .. ':blocked'),
    active,
  }
  local minute = math.floor(now / 60000)
  local left = 1 - (now % 60000) / 60000 -- the part of the oldest minute still in the window
  local windows = {}
  for k, state in ipairs({'finished', 'failed'}) do
    local names = {state}
    for m = minute - 60, minute do
      names[#names + 1] = state .. ':' .. int(m)
    end
    local v = call('HMGET', B .. ':stats', unpack(names))
    out[#out + 1] = field_int(v[1], MAX_MS)
    local hour = field_int(v[2], MAX_MS) * left
    for j = 3, #v do
      hour = hour + field_int(v[j], MAX_MS)
    end
    local last = field_int(v[#v], MAX_MS) + field_int(v[#v - 1], MAX_MS) * left
    windows[k] = {math.floor(last + 0.5), math.floor(hour + 0.5)}
  end
  out[#out + 1] = windows[1][1]
  out[#out + 1] = windows[2][1]
  out[#out + 1] = windows[1][2]
  out[#out + 1] = windows[2][2]
  return out
end

--[[ queasy_leases: the jobs a client holds (read-only), to reconcile after a lost reply.
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  client id
Returns: {id, token, id, token, ...}
]]
local function leases(keys, args)
  local out = call('HGETALL', keys[1] .. ':lease:' .. args[2])
  for i = 2, #out, 2 do
    out[i] = string.match(out[i], '^%S*') -- the token of "<token> <leased_at>"
  end
  return out
end

--[[ queasy_schedule_info: a queue's schedule (read-only), for status.
KEYS[1]  B
ARGV[1]  now (ms or '')
Returns: nil when B has no schedule, else {spec, fire_at, state, last_fire_at, last_outcome,
         last_ended_at, skipped}: fire_at is the current occurrence's fire time; state its
         state ('active' | 'waiting' | 'delayed', '' when there is none: the next check of a
         supervisor creates it); '' for a field not set yet.
]]
local function schedule_info(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  local v = call('HMGET', B .. ':schedule', 'spec', 'fire_at', 'last_fire_at',
    'last_outcome', 'last_ended_at', 'skipped')
  if v[1] == false then
    return nil
  end
  local state = ''
  local occurrence = living(B, SCHEDULE_ID, now, false)
  if occurrence ~= nil and occurrence[1] ~= 'blocked' then
    state = occurrence[1]
  end
  return {v[1], v[2] or '', state, v[3] or '', v[4] or '', v[5] or '', v[6] or '0'}
end

--[[ queasy_version
KEYS: none.  ARGV: none.
Returns: the library version string, "major.minor.patch" (the shape every queasy_py expects).
]]
local function version()
  return VERSION
end

--[[ queasy_library: the marker of queasy_py's library (since 1.2.0; another library named
`queasy`, such as the Node.js original's, has none).
KEYS: none.  ARGV: none.
Returns: "queasy_py <major.minor.patch>".
]]
local function library()
  return OWNER .. ' ' .. VERSION
end

--[[ queasy_upgrade: convert a step of B's keys of library 4.x into the 5.0 layout (see
"upgrade of 4.x data"); a read-only call refused with 'TRYAGAIN upgrading' calls it, then
tries again. Every write call converts so too, before anything else.
KEYS[1]  B
ARGV[1]  now (ms or '')
Returns: how many 4.x records are left to convert, at most (0: B is in the 5.0 layout).
]]
local function upgrade(keys, args)
  local B = keys[1]
  clock(args[1])
  if call('EXISTS', B .. ':layout') == 1 then
    return 0
  end
  local _, left = upgrade_step(B)
  return left
end

-- ---------------------------------------------------------------- registration

-- The migration guard: while B's slot moves between two nodes of a Redis Cluster (resharding),
-- a key not yet on this node cannot be read here, and a call that failed half-way (after
-- a write) would lose jobs. Reading two keys of the slot that never exist fails on both
-- nodes then (ASK on the source, TRYAGAIN on the target for a multi-key read of missing
-- keys): the call is refused with TRYAGAIN before any read or write, and the caller tries
-- again after a backoff. On a single server, or a slot that is not moving, it reads nothing.
-- The one read is joined to B:layout's (5.0): EXISTS counts 1 on a queue in the 5.0 layout;
-- 0: layout_of upgrades it (or refuses). `keys` are the call's keys: each is a queue's base
-- key (queasy_fail's second is its fail queue, which it writes too). Returns nil to go on,
-- else the reply (a refusal); and the keys of the fresh queues it met, if any (first_call).
local function guard(keys, reads)
  local read = {}
  for i, B in ipairs(keys) do
    read[i] = B .. ':layout'
  end
  read[#read + 1] = keys[1] .. ':guard:1'
  read[#read + 1] = keys[1] .. ':guard:2'
  local ok, marked = pcall(call, 'EXISTS', unpack(read))
  if not ok then
    return moving(keys[1])
  elseif marked == #keys then
    return nil
  end
  local marked = nil
  for _, B in ipairs(keys) do
    if call('EXISTS', B .. ':layout') == 0 then
      local refused, fresh = layout_of(B, reads)
      if refused ~= nil then
        return refused
      elseif fresh then
        marked = marked or {}
        marked[#marked + 1] = B
      end
    end
  end
  return nil, marked
end

-- A write call on the fresh queues `marked` (no B:layout, no living job: fresh_queue): each
-- is marked '5' after the call if it holds a job then. One that wrote none (refused: INVALID,
-- or stale) writes no mark either: a refusal writes nothing; the next call looks again.
local function first_call(fn, keys, args, marked)
  local reply = fn(keys, args)
  for _, B in ipairs(marked) do
    if not fresh_queue(B) then
      call('SET', B .. ':layout', '5')
    end
  end
  return reply
end

-- An entry point as registered: `call` is redis.call while it runs. A call with keys passes
-- the migration guard and the layout's check first (nothing is read or written when it
-- refuses, but a step of the upgrade of 4.x data); with `guarded`, the function reads them
-- itself, with its first read (guarded_exists: dequeue, finish). `reads`: a read-only
-- function (it cannot upgrade: it refuses while there are 4.x records to convert).
local function entry(fn, guarded, reads)
  return function(keys, args)
    call, format, find = redis.call, string.format, string.find
    if keys[1] ~= nil and not guarded then
      local refused, marked = guard(keys, reads)
      if refused ~= nil then
        return refused
      elseif marked ~= nil then
        return first_call(fn, keys, args, marked)
      end
    end
    return fn(keys, args)
  end
end

-- queasy_upgrade: the migration guard only (it does what layout_of would)
local function upgrade_entry(keys, args)
  call, format, find = redis.call, string.format, string.find
  if not pcall(call, 'EXISTS', keys[1] .. ':guard:1', keys[1] .. ':guard:2') then
    return moving(keys[1])
  end
  return upgrade(keys, args)
end

redis.register_function('queasy_dispatch', entry(dispatch))
redis.register_function('queasy_dispatch_once', entry(dispatch_once))
redis.register_function('queasy_dispatch_letter', entry(dispatch_letter))
redis.register_function('queasy_cancel', entry(cancel))
redis.register_function('queasy_requeue', entry(requeue_failed))
redis.register_function('queasy_purge', entry(purge))
redis.register_function('queasy_dequeue', entry(dequeue, true))
redis.register_function('queasy_finish', entry(finish, true))
redis.register_function('queasy_retry', entry(retry))
redis.register_function('queasy_fail', entry(fail))
redis.register_function('queasy_bump', entry(bump))
redis.register_function('queasy_leave', entry(leave))
redis.register_function('queasy_unpark', entry(unpark))
redis.register_function('queasy_schedule', entry(schedule))
redis.register_function('queasy_unschedule', entry(unschedule))
redis.register_function('queasy_upgrade', upgrade_entry)
redis.register_function{function_name = 'queasy_get_job', callback = entry(get_job, false, true),
  flags = {'no-writes'}}
redis.register_function{function_name = 'queasy_counts', callback = entry(counts, false, true),
  flags = {'no-writes'}}
redis.register_function{function_name = 'queasy_jobs', callback = entry(jobs, false, true),
  flags = {'no-writes'}}
redis.register_function{function_name = 'queasy_schedule_info',
  callback = entry(schedule_info, false, true), flags = {'no-writes'}}
redis.register_function{function_name = 'queasy_leases', callback = entry(leases, false, true),
  flags = {'no-writes'}}
redis.register_function{function_name = 'queasy_version', callback = entry(version),
  flags = {'no-writes'}}
redis.register_function{function_name = 'queasy_library', callback = entry(library),
  flags = {'no-writes'}}
