-- Argo CD health check for handoff.io/ReplayRequest.
-- Install as resource.customizations.health.handoff.io_ReplayRequest in argocd-cm (docs/argocd.md).
--
-- A ReplayRequest is a one-shot job: Healthy once it Succeeded (or, with dryRun, once its plan is
-- ready), Degraded when it Failed, Progressing before that. Its spec is immutable, but a status from an
-- older generation is still treated as not yet observed.
-- #include prelude.lua

local status = obj.status
if status == nil or status.phase == nil then
  return verdict("Progressing", "Waiting for the operator to plan the replay")
end
if stale(status) then
  return verdict("Progressing", "Waiting for the operator to observe generation " .. tostring(generation))
end

local degraded = condition(status.conditions, "Degraded")
local ready = condition(status.conditions, "Ready")
local progressing = condition(status.conditions, "Progressing")
local summary = nil
if status.plan ~= nil then summary = status.plan.summary end

if status.phase == "Failed" or (degraded ~= nil and degraded.status == "True") then
  return verdict("Degraded", describe(degraded, describe(ready, "Replay failed")))
end
if status.phase == "Succeeded" then
  return verdict("Healthy", describe(ready, summary or "Replay succeeded"))
end
if status.phase == "Planned" and obj.spec ~= nil and obj.spec.dryRun == true then
  return verdict("Healthy", "Dry run: " .. (summary or "plan ready in status.plan"))
end
return verdict("Progressing", describe(progressing, "Replay " .. status.phase))
