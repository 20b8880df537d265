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
  B:job:<id>           hash    the waiting/delayed/blocked record of <id>:
                               id, data, run_at, retry_count, stall_count, timeout_count
                               (+ u_data, u_run_at, u_reset: the update flags of a blocked job)
  B:active:<id>        hash    the active record of <id>: same fields + client, token, leased_at
  B:blocked            set     ids whose record in B:job:<id> waits for the active one
  B:expiry             zset    client id -> expiry (ms) of each client holding leases here
  B:lease:<client>     hash    id -> lease token of each job this client has checked out
  B:swept              zset    client id -> time it was swept (tombstones, kept 24 h)
  B:parked             hash    client id -> free slots it has parked here: an idle client's
                               dequeue leaves them, and dispatch leases a ready job straight
                               to a live parked client (a push) instead of queueing it
  B:seq                string  counter of push lease tokens ('p<n>')
  B:events             stream  one entry per job outcome (capped, MAXLEN ~): id, queue, outcome,
                               run_at, started_at, ended_at, client, pid, retry_count,
                               stall_count, timeout_count, error_name, error_kind
  B:wake               channel PUBLISHed when a dispatch may make a job ready earlier
  B:push:<client>      channel a job pushed to <client> (already leased to it), one per message:
                               "id\ntoken\nrun_at\nretry_count\nstall_count\ntimeout_count\ndata"
                               (ids hold no whitespace; data is last and may hold anything)

Conventions: times are integer milliseconds since the epoch. ARGV[1] of every function is
`now` in ms, or the empty string to use the server's clock (TIME). Entry points turn ARGV
strings into typed locals; helpers never see the strings '0'/'1'/'false'.

Result codes (queasy_py/library.py maps them to an enum):
  dispatch: 1 created, 2 updated (waiting job), 3 blocked (new), 4 blocked (updated)
  finish/retry/fail: 0 ok, 1 stale (this client no longer holds that lease)
  dequeue/bump: status 0 ok, 2 swept (this client was swept as dead; start over)
]]

local VERSION = '1.1.1'
local TOMBSTONE_MS = 86400000
local JOB_FIELDS = {'id', 'data', 'run_at', 'retry_count', 'stall_count', 'timeout_count'}

-- ---------------------------------------------------------------- helpers

local function clock(arg)
  if arg ~= nil and arg ~= '' then
    return tonumber(arg)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function to_bool(arg)
  return arg == '1' or arg == 'true'
end

local function read_job(key)
  local v = redis.call('HMGET', key, unpack(JOB_FIELDS))
  if v[1] == false then
    return nil
  end
  return {
    id = v[1], data = v[2], run_at = tonumber(v[3]),
    retry_count = tonumber(v[4]), stall_count = tonumber(v[5]), timeout_count = tonumber(v[6]),
  }
end

local function write_job(key, job)
  redis.call('HSET', key, 'id', job.id, 'data', job.data, 'run_at', job.run_at,
    'retry_count', job.retry_count, 'stall_count', job.stall_count,
    'timeout_count', job.timeout_count)
end

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

local function emit(B, maxlen, fields)
  if maxlen > 0 then
    redis.call('XADD', B .. ':events', 'MAXLEN', '~', maxlen, '*', unpack(fields))
  end
end

-- `job.client` is the client that held it ('' for a job that was not active).
local function outcome_event(B, maxlen, now, outcome, job, pid, started_at, err_name, err_kind)
  emit(B, maxlen, {
    'id', job.id, 'queue', string.match(B, '}:(.*)$'), 'outcome', outcome, 'run_at', job.run_at,
    'started_at', started_at, 'ended_at', now,
    'client', job.client or '', 'pid', pid,
    'retry_count', job.retry_count, 'stall_count', job.stall_count,
    'timeout_count', job.timeout_count,
    'error_name', err_name, 'error_kind', err_kind,
  })
end

-- Put `job` (leaving the active state) back in waiting at run_at, merging the update of a
-- blocked job with its id, if any, so one job with that id remains.
local function requeue(B, job, run_at)
  local id = job.id
  local bkey = B .. ':job:' .. id
  local blocked = redis.call('HMGET', bkey, 'data', 'run_at', 'u_data', 'u_run_at', 'u_reset')
  if blocked[1] ~= false then
    if blocked[3] == '1' then
      job.data = blocked[1]
    end
    run_at = merge_run_at(run_at, tonumber(blocked[2]), blocked[4])
    if blocked[5] == '1' then
      job.retry_count, job.stall_count, job.timeout_count = 0, 0, 0
    end
    redis.call('DEL', bkey)
    redis.call('SREM', B .. ':blocked', id)
  end
  job.run_at = run_at
  redis.call('DEL', B .. ':active:' .. id)
  write_job(bkey, job)
  redis.call('ZADD', B .. ':waiting', run_at, id)
end

-- The active job `id` has ended: drop it and promote a blocked job with its id, if any.
-- `any_blocked` false (B:blocked is empty) saves a lookup.
local function retire(B, id, any_blocked)
  redis.call('DEL', B .. ':active:' .. id)
  if any_blocked and redis.call('SREM', B .. ':blocked', id) == 1 then
    local bkey = B .. ':job:' .. id
    redis.call('HDEL', bkey, 'u_data', 'u_run_at', 'u_reset')
    local run_at = redis.call('HGET', bkey, 'run_at')
    redis.call('ZADD', B .. ':waiting', run_at, id)
    redis.call('PUBLISH', B .. ':wake', run_at)
  end
end

-- Check the lease of `client` on `id` (the active record names its client and token; a
-- swept client's record is gone or re-leased). Returns the active record or nil when stale.
local function leased(B, client, id, token)
  local v = redis.call('HMGET', B .. ':active:' .. id, 'id', 'data', 'run_at', 'retry_count',
    'stall_count', 'timeout_count', 'client', 'token')
  if v[7] ~= client or v[8] ~= token then
    return nil
  end
  redis.call('HDEL', B .. ':lease:' .. client, id)
  return {
    id = v[1], data = v[2], run_at = tonumber(v[3]), retry_count = tonumber(v[4]),
    stall_count = tonumber(v[5]), timeout_count = tonumber(v[6]), client = client,
  }
end

-- The loop of finish, retry and fail: for each group of `width` ARGV from index 4 (id and
-- token first), `act(job, i)` runs on the job when `client` still holds its lease (when
-- `usable(i)` is true, if given; else the lease is left alone). Returns one code per job:
-- 0 ok, 1 stale.
local function each_leased(B, client, args, width, act, usable)
  local codes = {}
  for i = 4, #args, width do
    local job = nil
    if usable == nil or usable(i) then
      job = leased(B, client, args[i], args[i + 1])
    end
    if job == nil then
      codes[#codes + 1] = 1
    else
      act(job, i)
      codes[#codes + 1] = 0
    end
  end
  return codes
end

-- Sweep one dead client (expiry passed), other than `self`: its active jobs go back to
-- waiting with stall_count + 1. Bounded: at most one client per call.
local function sweep_one(B, now, self, maxlen)
  local dead = redis.call('ZRANGE', B .. ':expiry', '-inf', now, 'BYSCORE', 'LIMIT', 0, 2)
  for _, client in ipairs(dead) do
    if client ~= self then
      local lkey = B .. ':lease:' .. client
      local leases = redis.call('HKEYS', lkey)
      for _, id in ipairs(leases) do
        local job = read_job(B .. ':active:' .. id)
        if job ~= nil then
          job.stall_count = job.stall_count + 1
          job.client = client
          outcome_event(B, maxlen, now, 'stalled', job, '', '', 'StallError', 'stall')
          requeue(B, job, now)
        end
      end
      redis.call('DEL', lkey)
      redis.call('HDEL', B .. ':parked', client)
      redis.call('ZREM', B .. ':expiry', client)
      redis.call('ZADD', B .. ':swept', now, client)
      redis.call('ZREMRANGEBYSCORE', B .. ':swept', '-inf', now - TOMBSTONE_MS)
      return 1
    end
  end
  return 0
end

-- Register `client` as alive until now + expiry_ms. Returns false when it was swept.
local function keep_alive(B, now, client, expiry_ms)
  if redis.call('ZSCORE', B .. ':swept', client) ~= false then
    return false
  end
  redis.call('ZADD', B .. ':expiry', now + expiry_ms, client)
  return true
end

-- Check out the job `id` (its record in B:job:<id>, already removed from B:waiting) to
-- `client` under `token`. Returns its fields (JOB_FIELDS order).
local function lease(B, now, id, client, token)
  local akey = B .. ':active:' .. id
  local v = redis.call('HMGET', B .. ':job:' .. id, unpack(JOB_FIELDS))
  redis.call('RENAME', B .. ':job:' .. id, akey)
  redis.call('HSET', akey, 'client', client, 'token', token, 'leased_at', now)
  return v
end

-- The live clients parked on B, as a list of {client, slots}; dead ones are dropped from
-- B:parked (a client is live while its expiry is in the future).
local function live_parked(B, now)
  local pkey = B .. ':parked'
  local flat = redis.call('HGETALL', pkey)
  local out = {}
  for i = 1, #flat, 2 do
    local expiry = redis.call('ZSCORE', B .. ':expiry', flat[i])
    if expiry ~= false and tonumber(expiry) > now then
      out[#out + 1] = {flat[i], tonumber(flat[i + 1])}
    else
      redis.call('HDEL', pkey, flat[i])
    end
  end
  return out
end

-- Push the waiting job `id` to the parked client with the most slots, if any listens on
-- its push channel (PUBLISH counts the receivers; a client that does not listen is
-- unparked). Returns true when pushed (leased to that client), false to leave it waiting.
local function push(B, now, id, parked)
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
    local token = 'p' .. redis.call('INCR', B .. ':seq')
    local v = redis.call('HMGET', B .. ':job:' .. id, unpack(JOB_FIELDS))
    local message = table.concat({v[1], token, v[3], v[4], v[5], v[6], v[2]}, '\n')
    if redis.call('PUBLISH', B .. ':push:' .. client, message) > 0 then
      redis.call('ZREM', B .. ':waiting', id)
      lease(B, now, id, client, token)
      redis.call('HSET', B .. ':lease:' .. client, id, token)
      best[2] = best[2] - 1
      if best[2] > 0 then
        redis.call('HSET', B .. ':parked', client, best[2])
      else
        redis.call('HDEL', B .. ':parked', client)
      end
      return true
    end
    best[2] = 0
    redis.call('HDEL', B .. ':parked', client)
  end
end

local function next_run_at(B)
  local first = redis.call('ZRANGE', B .. ':waiting', 0, 0, 'WITHSCORES')
  if first[2] == nil then
    return ''
  end
  return first[2]
end

-- ================================================================ entry points, grouped by the
-- state they change (helpers above; registration at the end)

-- ---------------------------------------------------------------- producers: dispatch, cancel

--[[ queasy_dispatch: add or update jobs (one or many).
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  update_data '1'|'0': replace the data of an existing waiting/blocked job
ARGV[3]  update_run_at 'replace'|'keep'|'if_later'|'if_earlier'
ARGV[4]  reset_counts '1'|'0': zero retry/stall/timeout counts of an existing job
ARGV[5..] triples: id, data (JSON), run_at (ms, or '' for now)
Returns: one code per job: 1 created, 2 updated, 3 blocked (new), 4 blocked (updated).
Emits:   a job ready now (code 1 or 2) is pushed to a live parked client while one has slots
         (leased to it and PUBLISHed on B:push:<client>); otherwise PUBLISH B:wake <earliest
         run_at> when any job was created or updated and left waiting.
]]
local function dispatch(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  local update_data = to_bool(args[2])
  local mode = args[3]
  local reset = to_bool(args[4])
  local codes = {}
  local earliest = nil
  local parked = nil -- read once, when the first job ready now is met
  for i = 5, #args, 3 do
    local id, data = args[i], args[i + 1]
    local run_at = now
    if args[i + 2] ~= '' then
      run_at = tonumber(args[i + 2])
    end
    local jkey, akey = B .. ':job:' .. id, B .. ':active:' .. id
    local existing, is_active = nil, false
    if redis.call('EXISTS', jkey, akey) > 0 then -- one call for the usual new id
      existing = read_job(jkey)
      is_active = redis.call('EXISTS', akey) == 1
    end
    if existing == nil then
      redis.call('HSET', jkey, 'id', id, 'data', data, 'run_at', run_at,
        'retry_count', 0, 'stall_count', 0, 'timeout_count', 0)
      if is_active then
        redis.call('HSET', jkey, 'u_data', update_data and '1' or '0',
          'u_run_at', mode, 'u_reset', reset and '1' or '0')
        redis.call('SADD', B .. ':blocked', id)
        codes[#codes + 1] = 3
      else
        redis.call('ZADD', B .. ':waiting', run_at, id)
        codes[#codes + 1] = 1
      end
    else
      if update_data then
        existing.data = data
      end
      existing.run_at = merge_run_at(existing.run_at, run_at, mode)
      if reset then
        existing.retry_count, existing.stall_count, existing.timeout_count = 0, 0, 0
      end
      write_job(jkey, existing)
      if is_active then
        -- merge the flags so the union of the updates applies when the active job retries
        local flags = redis.call('HMGET', jkey, 'u_data', 'u_run_at', 'u_reset')
        redis.call('HSET', jkey,
          'u_data', (update_data or flags[1] == '1') and '1' or '0',
          'u_run_at', (flags[2] == 'replace' or mode == 'keep') and flags[2] or mode,
          'u_reset', (reset or flags[3] == '1') and '1' or '0')
        codes[#codes + 1] = 4
      else
        redis.call('ZADD', B .. ':waiting', existing.run_at, id)
        codes[#codes + 1] = 2
      end
      run_at = existing.run_at
    end
    if codes[#codes] <= 2 then
      if run_at <= now and parked == nil then
        parked = live_parked(B, now)
      end
      if run_at <= now and #parked > 0 and push(B, now, id, parked) then
        run_at = nil -- leased to a parked client: nothing to wake
      end
      if run_at ~= nil and (earliest == nil or run_at < earliest) then
        earliest = run_at
      end
    end
  end
  if earliest ~= nil then
    redis.call('PUBLISH', B .. ':wake', earliest)
  end
  return codes
end

--[[ queasy_cancel: remove a waiting, delayed or blocked job. Never touches an active job.
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  events maxlen (0: no event)
ARGV[3]  id
Returns: 1 if a job was removed, else 0.
Emits:   event outcome=cancelled.
]]
local function cancel(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  local maxlen = tonumber(args[2])
  local id = args[3]
  local jkey = B .. ':job:' .. id
  local job = read_job(jkey)
  if job == nil then
    return 0
  end
  redis.call('DEL', jkey)
  redis.call('ZREM', B .. ':waiting', id)
  redis.call('SREM', B .. ':blocked', id)
  outcome_event(B, maxlen, now, 'cancelled', job, '', '', '', '')
  return 1
end

-- ---------------------------------------------------------------- lease cycle: dequeue ... fail

--[[ queasy_dequeue: check out up to `limit` ready jobs (run_at <= now) for a client.
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  client id
ARGV[3]  nonce: lease tokens are <nonce>.<n>
ARGV[4]  limit (>= 0; 0 only bumps and sweeps)
ARGV[5]  expiry ms: the client is alive until now + expiry
ARGV[6]  events maxlen (for events of a sweep)
ARGV[7]  park '1'|'0' (optional): with '1', when fewer than `limit` jobs are ready the
         client parks the slots left (B:parked), so dispatch pushes jobs straight to it;
         when `limit` jobs were checked out its parked slots are cleared
Returns: {status, next_run_at, id, token, data, run_at, retry_count, stall_count,
          timeout_count, id, ...}: status 0 ok or 2 swept (then no jobs); next_run_at is
          the earliest run_at still waiting ('' if none), so the caller can sleep until then.
Sweeps at most one dead client first.
]]
local function dequeue(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  local client, nonce = args[2], args[3]
  local limit, expiry_ms, maxlen = tonumber(args[4]), tonumber(args[5]), tonumber(args[6])
  sweep_one(B, now, client, maxlen)
  if not keep_alive(B, now, client, expiry_ms) then
    return {2, ''}
  end
  local out = {0, ''}
  if limit > 0 then
    local ids = redis.call('ZRANGE', B .. ':waiting', '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
    if #ids > 0 then
      local leases = {}
      redis.call('ZREM', B .. ':waiting', unpack(ids))
      for n, id in ipairs(ids) do
        local token = nonce .. '.' .. n
        local v = lease(B, now, id, client, token)
        leases[#leases + 1] = id
        leases[#leases + 1] = token
        out[#out + 1] = id
        out[#out + 1] = token
        for f = 2, 6 do
          out[#out + 1] = v[f]
        end
      end
      redis.call('HSET', B .. ':lease:' .. client, unpack(leases))
    end
    if to_bool(args[7]) and #ids < limit then
      redis.call('HSET', B .. ':parked', client, limit - #ids)
    else
      redis.call('HDEL', B .. ':parked', client)
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
ARGV[4..] quadruples: id, token, worker pid, started_at (ms)
Returns: one code per job: 0 ok, 1 stale (lease lost; nothing changed).
Emits:   event outcome=finished. A blocked job with the same id becomes waiting.
]]
local function finish(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  local client, maxlen = args[2], tonumber(args[3])
  local any_blocked = redis.call('EXISTS', B .. ':blocked') == 1
  return each_leased(B, client, args, 4, function(job, i)
    outcome_event(B, maxlen, now, 'finished', job, args[i + 2], args[i + 3], '', '')
    retire(B, job.id, any_blocked)
  end)
end

--[[ queasy_retry: put active jobs back in waiting at a given time.
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  client id
ARGV[3]  events maxlen
ARGV[4..] groups of 7: id, token, run_at (ms), kind, worker pid, started_at, error name
          kind: 'retry' (retry_count + 1), 'timeout' (timeout_count + 1),
                'stall' (stall_count + 1), 'release' (no count: shutdown hand-back),
                'return' (no count, no event: a pushed job the client had no room for;
                its parked slots are cleared and B:wake is PUBLISHed)
Returns: one code per job: 0 ok, 1 stale.
Emits:   event outcome=retried|timed_out|stalled|released (none for 'return'). A blocked
         job's update is applied to the retried job (data, run_at, counts per its flags).
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
  local client, maxlen = args[2], tonumber(args[3])
  return each_leased(B, client, args, 7, function(job, i)
    local kind = RETRY_KINDS[args[i + 3]]
    if kind[1] ~= nil then
      job[kind[1]] = job[kind[1]] + 1
    end
    if kind[2] ~= nil then
      outcome_event(B, maxlen, now, kind[2], job, args[i + 4], args[i + 5], args[i + 6],
        kind[3])
    end
    requeue(B, job, tonumber(args[i + 2]))
    if kind[2] == nil then
      redis.call('HDEL', B .. ':parked', client)
      redis.call('PUBLISH', B .. ':wake', job.run_at)
    end
  end, function(i)
    return RETRY_KINDS[args[i + 3]] ~= nil -- an unknown kind must not consume the lease
  end)
end

--[[ queasy_fail: jobs failed for good; each fail job is dispatched in the same call.
KEYS[1]  B
KEYS[2]  F: base key of the fail queue (same hash tag), or absent when there is no fail handler
ARGV[1]  now (ms or '')
ARGV[2]  client id
ARGV[3]  events maxlen (of B)
ARGV[4..] groups of 8: id, token, fail job id, fail job data (JSON; '' without F),
          worker pid, started_at, error name, error kind
Returns: one code per job: 0 ok, 1 stale (nothing changed, no fail job).
Emits:   event outcome=failed on B; PUBLISH F:wake.
]]
local function fail(keys, args)
  local B, F = keys[1], keys[2]
  local now = clock(args[1])
  local client, maxlen = args[2], tonumber(args[3])
  local any_blocked = redis.call('EXISTS', B .. ':blocked') == 1
  local dispatched = false
  local codes = each_leased(B, client, args, 8, function(job, i)
    outcome_event(B, maxlen, now, 'failed', job, args[i + 4], args[i + 5], args[i + 6],
      args[i + 7])
    retire(B, job.id, any_blocked)
    if F ~= nil then
      local fid = args[i + 2]
      write_job(F .. ':job:' .. fid, {id = fid, data = args[i + 3], run_at = now,
        retry_count = 0, stall_count = 0, timeout_count = 0})
      redis.call('ZADD', F .. ':waiting', now, fid)
      dispatched = true
    end
  end)
  if dispatched then
    redis.call('PUBLISH', F .. ':wake', now)
  end
  return codes
end

-- ---------------------------------------------------------------- clients: bump, leave, unpark
-- (a sweep of one dead client runs inside dequeue and bump: sweep_one above)

--[[ queasy_bump: heartbeat of a client.
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  client id
ARGV[3]  expiry ms
ARGV[4]  events maxlen (for events of a sweep)
Returns: 0 ok, 2 when this client was already swept (it must drop its jobs and start over).
Sweeps at most one dead client.
]]
local function bump(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  local client = args[2]
  sweep_one(B, now, client, tonumber(args[4]))
  if not keep_alive(B, now, client, tonumber(args[3])) then
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
  local client = args[2]
  redis.call('HDEL', B .. ':parked', client)
  local held = redis.call('HLEN', B .. ':lease:' .. client)
  if held == 0 then
    redis.call('ZREM', B .. ':expiry', client)
  end
  return held
end

--[[ queasy_unpark: a client stops taking pushed jobs (it shuts down, or reconciles).
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  client id
ARGV[3]  mark: a string without a newline, PUBLISHed on B:push:<client> after clearing, so
         the client knows every job pushed to it before has arrived once the mark has
Returns: {1 if it had parked slots else 0, receivers of the mark}. No job is pushed to it
         after this (until it parks again).
]]
local function unpark(keys, args)
  local B, client = keys[1], args[2]
  local had = redis.call('HDEL', B .. ':parked', client)
  return {had, redis.call('PUBLISH', B .. ':push:' .. client, args[3])}
end

-- ---------------------------------------------------------------- reads: no writes

--[[ queasy_get_job: one job's record and state (read-only).
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  id
Returns: nil, or {state, id, data, run_at, retry_count, stall_count, timeout_count}:
         the active record if there is one, else the waiting one.
         state: 'active' | 'blocked' | 'waiting' | 'delayed'
]]
local function get_job(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  local id = args[2]
  local job = read_job(B .. ':active:' .. id)
  local state = 'active'
  if job == nil then
    job = read_job(B .. ':job:' .. id)
    if job == nil then
      return nil
    end
    if redis.call('SISMEMBER', B .. ':blocked', id) == 1 then
      state = 'blocked'
    elseif job.run_at > now then
      state = 'delayed'
    else
      state = 'waiting'
    end
  end
  return {state, job.id, job.data, tostring(job.run_at), job.retry_count, job.stall_count,
    job.timeout_count}
end

--[[ queasy_counts: jobs per state (read-only).
KEYS[1]  B
ARGV[1]  now (ms or '')
Returns: {waiting, delayed, blocked, active}
]]
local function counts(keys, args)
  local B = keys[1]
  local now = clock(args[1])
  -- every lease holder is in B:expiry (a swept client's leases are gone with it)
  local active = 0
  for _, client in ipairs(redis.call('ZRANGE', B .. ':expiry', 0, -1)) do
    active = active + redis.call('HLEN', B .. ':lease:' .. client)
  end
  return {
    redis.call('ZCOUNT', B .. ':waiting', '-inf', now),
    redis.call('ZCOUNT', B .. ':waiting', '(' .. now, '+inf'),
    redis.call('SCARD', B .. ':blocked'),
    active,
  }
end

--[[ queasy_leases: the jobs a client holds (read-only), to reconcile after a lost reply.
KEYS[1]  B
ARGV[1]  now (ms or '')
ARGV[2]  client id
Returns: {id, token, id, token, ...}
]]
local function leases(keys, args)
  return redis.call('HGETALL', keys[1] .. ':lease:' .. args[2])
end

--[[ queasy_version
KEYS: none.  ARGV: none.
Returns: the library version string, "major.minor.patch".
]]
local function version()
  return VERSION
end

-- ---------------------------------------------------------------- registration

redis.register_function('queasy_dispatch', dispatch)
redis.register_function('queasy_cancel', cancel)
redis.register_function('queasy_dequeue', dequeue)
redis.register_function('queasy_finish', finish)
redis.register_function('queasy_retry', retry)
redis.register_function('queasy_fail', fail)
redis.register_function('queasy_bump', bump)
redis.register_function('queasy_leave', leave)
redis.register_function('queasy_unpark', unpark)
redis.register_function{function_name = 'queasy_get_job', callback = get_job,
  flags = {'no-writes'}}
redis.register_function{function_name = 'queasy_counts', callback = counts,
  flags = {'no-writes'}}
redis.register_function{function_name = 'queasy_leases', callback = leases,
  flags = {'no-writes'}}
redis.register_function{function_name = 'queasy_version', callback = version,
  flags = {'no-writes'}}
