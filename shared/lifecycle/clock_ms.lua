-- Redis's clock now, in µs and in ms since the epoch: the one place a script reads TIME.
local function clock_us()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000000 + tonumber(now[2])  -- exact in a double until the year 2255
end

local function clock_ms()
  return math.floor(clock_us() / 1000)
end
