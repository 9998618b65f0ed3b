// Package doctest holds the health event document that the tests and benchmarks of the watcher
// and of package document share. It is imported by tests only.
package doctest

import "time"

// HealthRowJSON is the new_values of a health_events row as PostgreSQL's jsonb writes it (keys
// by length, a space after each colon and comma): about 1 KB, the document of the benchmark
// command's drain_health.
const HealthRowJSON = `{"id": "5f0c3c1e-8c1a-4c2e-9d1e-0b6a7c2d9e11", "document": {"createdAt": "2025-03-14T15:09:26.535897Z", ` +
	`"healthevent": {"agent": "gpu-health-monitor", "isfatal": true, "message": "XID 79: GPU has fallen off the bus (PCI:0000:3b:00)", ` +
	`"version": 1, "metadata": {"rack": "r17", "kernel": "5.15.0-1061-nvidia", "cluster": "train-east-2", "cuda_version": "12.4", ` +
	`"instance_type": "p5.48xlarge", "chassis_serial": "1563620001234", "driver_version": "550.90.07"}, ` +
	`"nodename": "gpu-node-017.train-east-2.internal", "checkname": "GpuXidError", "errorcode": ["79"], "ishealthy": false, ` +
	`"componentclass": "GPU", "drainoverrides": {"skip": false, "force": false}, "entitiesimpacted": [{"entitytype": "GPU", ` +
	`"entityvalue": "3"}, {"entitytype": "PCI", "entityvalue": "0000:3b:00.0"}, {"entitytype": "GPU_UUID", ` +
	`"entityvalue": "GPU-5f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"}], "recommendedaction": 2, ` +
	`"generatedtimestamp": {"nanos": 535897000, "seconds": 1741964966}, "quarantineoverrides": {"skip": false, "force": false}}, ` +
	`"healtheventstatus": {"faultremediated": null, "nodequarantined": null, "userpodsevictionstatus": {"status": "", "message": ""}, ` +
	`"lastremediationtimestamp": null}}}`

// HealthEventWithStatus has the shape of the store-client's HealthEventWithStatus.
type HealthEventWithStatus struct {
	ID          string    `json:"id"`
	CreatedAt   time.Time `json:"createdAt"`
	HealthEvent *struct {
		Version           int    `json:"version"`
		Agent             string `json:"agent"`
		ComponentClass    string `json:"componentclass"`
		CheckName         string `json:"checkname"`
		IsFatal           bool   `json:"isfatal"`
		IsHealthy         bool   `json:"ishealthy"`
		Message           string `json:"message"`
		RecommendedAction int    `json:"recommendedaction"`
		ErrorCode         []string
		EntitiesImpacted  []struct {
			EntityType  string `json:"entitytype"`
			EntityValue string `json:"entityvalue"`
		} `json:"entitiesimpacted"`
		Metadata           map[string]string `json:"metadata"`
		GeneratedTimestamp struct {
			Seconds int64 `json:"seconds"`
			Nanos   int32 `json:"nanos"`
		} `json:"generatedtimestamp"`
		NodeName            string          `json:"nodename"`
		QuarantineOverrides map[string]bool `json:"quarantineoverrides"`
		DrainOverrides      map[string]bool `json:"drainoverrides"`
	} `json:"healthevent"`
	HealthEventStatus struct {
		NodeQuarantined        *string `json:"nodequarantined"`
		UserPodsEvictionStatus struct {
			Status  string `json:"status"`
			Message string `json:"message"`
		} `json:"userpodsevictionstatus"`
		FaultRemediated          *bool      `json:"faultremediated"`
		LastRemediationTimestamp *time.Time `json:"lastremediationtimestamp"`
	} `json:"healtheventstatus"`
}
