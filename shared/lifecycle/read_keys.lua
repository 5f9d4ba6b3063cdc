-- Called by the scripts that read a key of every job they are given (the step, the renewal): one
-- command for them all rather than one a job, since most of what a command costs inside a script
-- is the call itself, whatever its number of keys. KEYS[from..to] go to the command in slices, as
-- Lua's unpack takes at most a few thousand values at once.
local UNPACK_MAX = 4000

-- The values of KEYS[from..to] (MGET), in their order: false for a key with no string value.
local function get_keys(from, to)
  local values = {}
  for start = from, to, UNPACK_MAX do
    local slice = redis.call('MGET', unpack(KEYS, start, math.min(start + UNPACK_MAX - 1, to)))
    for i = 1, #slice do values[#values + 1] = slice[i] end
  end
  return values
end
