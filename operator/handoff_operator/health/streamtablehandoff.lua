-- Argo CD health check for handoff.io/StreamTableHandoff.
-- Install as resource.customizations.health.handoff.io_StreamTableHandoff in argocd-cm (docs/argocd.md).
--
-- Order matters: a suspended handoff is Suspended whatever its conditions say; a status computed for an
-- older metadata.generation says nothing about the current spec, so it is Progressing until the operator
-- catches up (otherwise a bad edit would show Healthy from the previous spec's Ready=True).
-- #include prelude.lua

if obj.spec ~= nil and obj.spec.suspend == true then
  return verdict("Suspended", "Suspended (spec.suspend: true)")
end

local status = obj.status
if status == nil then
  return verdict("Progressing", "Waiting for the operator to report status")
end

if stale(status) then
  return verdict("Progressing", "Waiting for the operator to observe generation " .. tostring(generation))
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
  return verdict("Suspended", describe(ready, "Suspended"))
end
if degraded ~= nil and degraded.status == "True" then
  return verdict("Degraded", describe(degraded, "Degraded"))
end
if status.phase == "Failed" then
  return verdict("Degraded", describe(ready, "Failed"))
end
if ready ~= nil and ready.status == "True" then
  local parts = {}
  if status.lag ~= nil then table.insert(parts, "lag " .. tostring(status.lag)) end
  if status.freshness ~= nil then table.insert(parts, "freshness " .. tostring(status.freshness)) end
  if #parts > 0 then
    return verdict("Healthy", describe(ready, "Ready") .. " (" .. table.concat(parts, ", ") .. ")")
  end
  return verdict("Healthy", describe(ready, "Ready"))
end
if progressing ~= nil and progressing.status == "True" then
  return verdict("Progressing", describe(progressing, "Progressing"))
end
if ready ~= nil and ready.status == "False" then
  -- Not ready and not making progress towards it: someone has to look.
  return verdict("Degraded", describe(ready, "Not ready"))
end
return verdict("Progressing", describe(ready, "Waiting for Ready"))
