-- weir: GCRA over several keys, all or nothing (see src/limiter/redis.rs).
--
-- KEYS[i]    one key per check; its value is the key's TAT as decimal
--            nanoseconds since the Unix epoch.
-- ARGV[1]    '' to use the server's clock (TIME), or "now" as decimal
--            nanoseconds since the Unix epoch (tests).
-- ARGV[2]    'check' or 'return'.
--
-- check: ARGV[2 + 5(i-1) + 1 .. 5]  emission interval T (ns), tolerance tau
--            (ns), burst, cost and lease wanted (extra tokens) of check i.
--   Returns 5 integers per check: status (0 allowed, 1 rejected, 2 cost
--   exceeds burst), remaining, retry_after (ns), reset (ns), tokens leased.
--   If any check is not allowed, nothing is written and allowed checks
--   report their state as it is (a cost-0 read). If all are allowed, each
--   check is also charged the extra tokens it wants, up to a quarter of what
--   its key has left above half its burst after its cost (src/lease.rs
--   says why).
--
-- return: ARGV[2 + 2(i-1) + 1 .. 2]  T (ns) and the unused leased tokens of
--   key i, given back: its TAT moves that many intervals earlier, not
--   before now. Returns {number of keys}.
--
-- Lua numbers are doubles, exact only below 2^53 (~104 days of ns), so
-- absolute times are never added up in ns: a TAT is split into seconds and
-- nanoseconds, and all arithmetic is on offsets from now, which stay below
-- 2 * tau <= 14 days of ns (weir caps tau at 7 days).

local function split(ns_text)
  local s = tonumber(string.sub(ns_text, 1, -10))
  local ns = tonumber(string.sub(ns_text, -9))
  if string.len(ns_text) < 10 then s = 0 end
  return s, ns
end

-- floor(a / b) for integers a >= 0, b >= 1, exact below 2^53.
local function floordiv(a, b)
  if a <= 0 then return 0 end
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local now_s, now_ns
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now_s = tonumber(t[1])
  now_ns = tonumber(t[2]) * 1000
else
  now_s, now_ns = split(ARGV[1])
end

-- Writes the TAT now + d (ns, d > 0) to key, expiring when it passes.
local function set_tat(key, d)
  local total = now_ns + d
  local carry = math.floor(total / 1e9)
  local ns = total - carry * 1e9
  if ns < 0 then carry = carry - 1; ns = ns + 1e9 end
  if ns >= 1e9 then carry = carry + 1; ns = ns - 1e9 end
  -- Expire once the TAT has passed: such a key decides like no key.
  redis.call('SET', key, string.format('%d%09d', now_s + carry, ns),
    'PX', math.ceil(d / 1e6))
end

-- The key's TAT as an offset from now (ns), 0 for no key.
local function offset_of(key)
  local v = redis.call('GET', key)
  if v then
    local s, ns = split(v)
    if s and ns then return (s - now_s) * 1e9 + (ns - now_ns) end
  end
  return 0
end

if ARGV[2] == 'return' then
  for i = 1, #KEYS do
    local b = 2 + (i - 1) * 2
    local d_back = offset_of(KEYS[i]) - tonumber(ARGV[b + 1]) * tonumber(ARGV[b + 2])
    if d_back > 0 then set_tat(KEYS[i], d_back) else redis.call('DEL', KEYS[i]) end
  end
  return {#KEYS}
end

local out = {}
local starts = {}
local offsets = {}
-- Offsets of TATs moved earlier in this call, so a key checked twice sees
-- its first check (as two calls in a row would).
local pending = {}
local admit = true

-- How many checks name each key: a key named twice gets no lease, so that
-- its one write cannot drop a charge.
local times = {}
for i = 1, #KEYS do times[KEYS[i]] = (times[KEYS[i]] or 0) + 1 end

for i = 1, #KEYS do
  local b = 2 + (i - 1) * 5
  local t = tonumber(ARGV[b + 1])
  local tau = tonumber(ARGV[b + 2])
  local burst = tonumber(ARGV[b + 3])
  local cost = tonumber(ARGV[b + 4])
  local d_tat = pending[KEYS[i]]
  if d_tat == nil then d_tat = offset_of(KEYS[i]) end
  -- A TAT is never more than tau ahead of the time it was set, so more means
  -- the server clock stepped back or the value is foreign: trust tau.
  local d_start = math.min(math.max(d_tat, 0), tau)
  starts[i] = d_start
  local o = (i - 1) * 5
  out[o + 5] = 0
  if cost > burst then
    out[o + 1], out[o + 2], out[o + 3], out[o + 4] = 2, 0, 0, d_start
    admit = false
  else
    local d_new = d_start + cost * t
    local d_allow = d_new - tau
    if d_allow > 0 then
      out[o + 1], out[o + 2], out[o + 3], out[o + 4] = 1, 0, d_allow, d_start
      admit = false
    else
      out[o + 1], out[o + 2], out[o + 3], out[o + 4] =
        0, floordiv(tau - d_new, t), 0, d_new
      if cost > 0 then
        pending[KEYS[i]] = d_new
        offsets[i] = d_new
      end
    end
  end
end

if admit then
  for i = 1, #KEYS do
    local d_new = offsets[i]
    if d_new then
      local b = 2 + (i - 1) * 5
      local t = tonumber(ARGV[b + 1])
      local extra = tonumber(ARGV[b + 5])
      local o = (i - 1) * 5
      if extra > 0 and times[KEYS[i]] == 1 then
        local burst = tonumber(ARGV[b + 3])
        local spare = out[o + 2] - math.floor(burst / 2)
        local grant = math.min(extra, floordiv(spare, 4))
        d_new = d_new + grant * t
        out[o + 2], out[o + 4], out[o + 5] = out[o + 2] - grant, d_new, grant
      end
      set_tat(KEYS[i], d_new)
    end
  end
else
  for i = 1, #KEYS do
    local o = (i - 1) * 5
    if out[o + 1] == 0 then
      local b = 2 + (i - 1) * 5
      local t = tonumber(ARGV[b + 1])
      local tau = tonumber(ARGV[b + 2])
      out[o + 2] = floordiv(tau - starts[i], t)
      out[o + 4] = starts[i]
    end
  end
end

return out
