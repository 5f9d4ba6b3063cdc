-- Writes a script's `fields` (a table of field names to values) into a hash; an empty one writes nothing.
local function hset_fields(key, fields)
  local flat = {}
  for name, value in pairs(fields) do
    flat[#flat + 1] = name
    flat[#flat + 1] = value
  end
  if #flat > 0 then redis.call('HSET', key, unpack(flat)) end
end
