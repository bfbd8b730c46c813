-- Shared by the Handoff health checks (handoff_operator.health puts it in place of the include line of
-- each script: Argo CD runs every check as one self-contained script).
local hs = {}

local function verdict(status, message)
  hs.status = status
  hs.message = message
  return hs
end

local function condition(conditions, type_)
  if conditions == nil then return nil end
  for _, c in ipairs(conditions) do
    if c.type == type_ then return c end
  end
  return nil
end

local function describe(c, fallback)
  if c == nil then return fallback end
  if c.message ~= nil and c.message ~= "" then
    if c.reason ~= nil and c.reason ~= "" then return c.reason .. ": " .. c.message end
    return c.message
  end
  if c.reason ~= nil and c.reason ~= "" then return c.reason end
  return fallback
end

local generation = nil
if obj.metadata ~= nil then generation = obj.metadata.generation end

local function stale(status)
  -- A status computed for an older metadata.generation says nothing about the current spec.
  return generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation)
end
