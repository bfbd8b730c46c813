-- Copy of operator/handoff_operator/health/streamtablehandoff.lua written by handoff_operator.crdgen.
-- Argo CD health check for handoff.io/StreamTableHandoff.
-- Install as resource.customizations.health.handoff.io_StreamTableHandoff in argocd-cm (docs/argocd.md).
--
-- Order matters: a suspended handoff is Suspended whatever its conditions say; a status computed for an
-- older metadata.generation says nothing about the current spec, so it is Progressing until the operator
-- catches up (otherwise a bad edit would show Healthy from the previous spec's Ready=True).
local hs = {}

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

if obj.spec ~= nil and obj.spec.suspend == true then
  hs.status = "Suspended"
  hs.message = "Suspended (spec.suspend: true)"
  return hs
end

local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end

if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local conditions = status.conditions
local function current(c)
  -- A condition stamped with an older generation is stale too.
  if c == nil then return nil end
  if generation ~= nil and c.observedGeneration ~= nil and c.observedGeneration < generation then return nil end
  return c
end
local ready = current(condition(conditions, "Ready"))
local progressing = current(condition(conditions, "Progressing"))
local degraded = current(condition(conditions, "Degraded"))

if status.phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = describe(ready, "Suspended")
  return hs
end
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(degraded, "Degraded")
  return hs
end
if status.phase == "Failed" then
  hs.status = "Degraded"
  hs.message = describe(ready, "Failed")
  return hs
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  local parts = {}
  if status.lag ~= nil then table.insert(parts, "lag " .. tostring(status.lag)) end
  if status.freshness ~= nil then table.insert(parts, "freshness " .. tostring(status.freshness)) end
  if #parts > 0 then
    hs.message = describe(ready, "Ready") .. " (" .. table.concat(parts, ", ") .. ")"
  else
    hs.message = describe(ready, "Ready")
  end
  return hs
end
if progressing ~= nil and progressing.status == "True" then
  hs.status = "Progressing"
  hs.message = describe(progressing, "Progressing")
  return hs
end
if ready ~= nil and ready.status == "False" then
  -- Not ready and not making progress towards it: someone has to look.
  hs.status = "Degraded"
  hs.message = describe(ready, "Not ready")
  return hs
end
hs.status = "Progressing"
hs.message = describe(ready, "Waiting for Ready")
return hs
