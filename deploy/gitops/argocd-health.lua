-- Argo CD health of a specdecode.io/SpecDecodeExperiment: the experiment's verdict as an Application's health.
--   Completed + Promote            -> Healthy      (the gate opens)
--   Completed + Reject, or Failed  -> Degraded     (measured and worse, or could not measure)
--   Completed + Inconclusive       -> Suspended    (too little evidence: a person decides; never Healthy)
--   anything else (no status yet, Pending, Deploying, Running, Analyzing) -> Progressing
-- A status that describes an older spec (status.observedGeneration < metadata.generation, or no
-- observedGeneration at all) is Progressing whatever it says: a verdict is bound to its generation.
-- Install: argocd-cm key resource.customizations.health.specdecode.io_SpecDecodeExperiment (argocd-cm.yaml).
local hs = {}

-- "<what>: <reason>: <message>", leaving out what is missing.
local function describe(what, status)
  local text = what
  for _, key in ipairs({"reason", "message"}) do
    local part = status[key]
    if part ~= nil and part ~= "" then
      text = text .. ": " .. part
    end
  end
  return text
end

local status = obj.status
if status == nil or status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to pick up the experiment"
  return hs
end

local generation = obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

if status.phase == "Failed" then
  hs.status = "Degraded"
  hs.message = describe("Failed", status)
  return hs
end

if status.phase == "Completed" then
  if status.verdict == "Promote" then
    hs.status = "Healthy"
  elseif status.verdict == "Reject" then
    hs.status = "Degraded"
  elseif status.verdict == "Inconclusive" then
    hs.status = "Suspended"
  else
    hs.status = "Progressing"
    hs.message = "Completed without a verdict yet"
    return hs
  end
  hs.message = describe(status.verdict, status)
  return hs
end

hs.status = "Progressing"
hs.message = describe(status.phase, status)
return hs
