-- Redis's clock now, in ms since the epoch: the one place a script reads TIME.
local function clock_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
