package events

import "github.com/faultline/faultline/schemas/gen/datamodels"

// Vars is a HealthEvent as the CEL `event` variable of every rule (the
// quarantine policy, the correlation triggers): NVSentinel's HealthEvent JSON field
// names, enums by name, lists and maps as CEL lists and maps; `submitter`
// is {name, role, node} of the credential that sent it, role "agent",
// "operator" or "pipeline" (an event without one: "agent").
func Vars(ev *datamodels.HealthEvent) map[string]any {
	ents := make([]any, 0, len(ev.GetEntitiesImpacted()))
	for _, e := range ev.GetEntitiesImpacted() {
		ents = append(ents, map[string]any{"entityType": e.GetEntityType(), "entityValue": e.GetEntityValue()})
	}
	md := make(map[string]any, len(ev.GetMetadata()))
	for k, v := range ev.GetMetadata() {
		md[k] = v
	}
	overrides := func(o *datamodels.BehaviourOverrides) map[string]any {
		return map[string]any{"force": o.GetForce(), "skip": o.GetSkip()}
	}
	return map[string]any{
		"version":                 int64(ev.GetVersion()),
		"id":                      ev.GetId(),
		"agent":                   ev.GetAgent(),
		"componentClass":          ev.GetComponentClass(),
		"checkName":               ev.GetCheckName(),
		"isFatal":                 ev.GetIsFatal(),
		"isHealthy":               ev.GetIsHealthy(),
		"message":                 ev.GetMessage(),
		"recommendedAction":       ev.GetRecommendedAction().String(),
		"customRecommendedAction": ev.GetCustomRecommendedAction(),
		"errorCode":               anyList(ev.GetErrorCode()),
		"entitiesImpacted":        ents,
		"metadata":                md,
		"nodeName":                ev.GetNodeName(),
		"cluster":                 ev.GetCluster(),
		"derivedBy":               ev.GetDerivedBy(),
		"causeIds":                anyList(ev.GetCauseIds()),
		"processingStrategy":      ev.GetProcessingStrategy().String(),
		"quarantineOverrides":     overrides(ev.GetQuarantineOverrides()),
		"drainOverrides":          overrides(ev.GetDrainOverrides()),
		"submitter": map[string]any{
			"name": ev.GetSubmitter().GetName(),
			"role": RoleName(SubmitterRole(ev)),
			"node": ev.GetSubmitter().GetNode(),
		},
	}
}

func anyList(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}
