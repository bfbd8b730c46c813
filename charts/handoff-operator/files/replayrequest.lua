-- Copy of operator/handoff_operator/health/replayrequest.lua written by handoff_operator.crdgen.
-- Argo CD health check for handoff.io/ReplayRequest.
-- Install as resource.customizations.health.handoff.io_ReplayRequest in argocd-cm (docs/argocd.md).
--
-- A ReplayRequest is a one-shot job: Healthy once it Succeeded (or, with dryRun, once its plan is
-- ready), Degraded when it Failed, Progressing before that. Its spec is immutable, but a status from an
-- older generation is still treated as not yet observed.
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

local status = obj.status
local generation = nil
if obj.metadata ~= nil then generation = obj.metadata.generation end
if status == nil or status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to plan the replay"
  return hs
end
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local degraded = condition(status.conditions, "Degraded")
local ready = condition(status.conditions, "Ready")
local progressing = condition(status.conditions, "Progressing")
local summary = nil
if status.plan ~= nil then summary = status.plan.summary end

if status.phase == "Failed" or (degraded ~= nil and degraded.status == "True") then
  hs.status = "Degraded"
  hs.message = describe(degraded, describe(ready, "Replay failed"))
  return hs
end
if status.phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = describe(ready, summary or "Replay succeeded")
  return hs
end
if status.phase == "Planned" and obj.spec ~= nil and obj.spec.dryRun == true then
  hs.status = "Healthy"
  hs.message = "Dry run: " .. (summary or "plan ready in status.plan")
  return hs
end
hs.status = "Progressing"
hs.message = describe(progressing, "Replay " .. status.phase)
return hs
