package main

import (
	"context"
	"fmt"
	"time"
)

// healthStruct is the shape of the store-client's HealthEventWithStatus, which typed health
// drains read each document into.
type healthStruct struct {
	ID          string    `json:"id"`
	CreatedAt   time.Time `json:"createdAt"`
	HealthEvent struct {
		Version           int    `json:"version"`
		Agent             string `json:"agent"`
		ComponentClass    string `json:"componentclass"`
		CheckName         string `json:"checkname"`
		IsFatal           bool   `json:"isfatal"`
		IsHealthy         bool   `json:"ishealthy"`
		Message           string `json:"message"`
		RecommendedAction int    `json:"recommendedaction"`
		EntitiesImpacted  []struct {
			EntityType  string `json:"entitytype"`
			EntityValue string `json:"entityvalue"`
		} `json:"entitiesimpacted"`
		Metadata           map[string]string `json:"metadata"`
		GeneratedTimestamp struct {
			Seconds int64 `json:"seconds"`
			Nanos   int32 `json:"nanos"`
		} `json:"generatedtimestamp"`
		NodeName string `json:"nodename"`
	} `json:"healthevent"`
	HealthEventStatus struct {
		NodeQuarantined        *string `json:"nodequarantined"`
		UserPodsEvictionStatus struct {
			Status  string `json:"status"`
			Message string `json:"message"`
		} `json:"userpodsevictionstatus"`
	} `json:"healtheventstatus"`
}

// healthDocument is the document column of a health_events row before remediation: about
// 1 KB of JSON, the shape the store-client writes. Each row gets its own node name.
const healthDocument = `{"createdAt":"2025-03-14T15:09:26.535897Z",
	"healthevent":{"version":1,"agent":"gpu-health-monitor","componentclass":"GPU","checkname":"GpuXidError",
	"isfatal":true,"ishealthy":false,"message":"XID 79: GPU has fallen off the bus (PCI:0000:3b:00)",
	"recommendedaction":2,"errorcode":["79"],"entitiesimpacted":[{"entitytype":"GPU","entityvalue":"3"},
	{"entitytype":"PCI","entityvalue":"0000:3b:00.0"},
	{"entitytype":"GPU_UUID","entityvalue":"GPU-5f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"}],
	"metadata":{"cluster":"train-east-2","rack":"r17","chassis_serial":"1563620001234","driver_version":"550.90.07",
	"cuda_version":"12.4","kernel":"5.15.0-1061-nvidia","instance_type":"p5.48xlarge"},
	"generatedtimestamp":{"seconds":1741964966,"nanos":535897000},"nodename":"gpu-node-017.train-east-2.internal",
	"quarantineoverrides":{"force":false,"skip":false},"drainoverrides":{"force":false,"skip":false}},
	"healtheventstatus":{"nodequarantined":null,"userpodsevictionstatus":{"status":"","message":""},
	"faultremediated":null,"lastremediationtimestamp":null}}`

// healthUpdate is the remediation update applied to a health_events row: two nested status
// fields change, as when the node is quarantined and its pods are being evicted.
const healthUpdate = `jsonb_set(jsonb_set(document, '{healtheventstatus,nodequarantined}', '"Quarantined"'),
	'{healtheventstatus,userpodsevictionstatus}', '{"status":"InProgress","message":"draining 14 pods"}')`

// fillHealth writes n changelog rows of the health_events table through the trigger, half of
// them updates: it inserts n - n/2 rows, fillChunk per statement, then updates n/2 of them,
// fillChunk per statement, then analyzes the changelog.
func (d *database) fillHealth(ctx context.Context, n int) error {
	inserts := n - n/2
	for from := 1; from <= inserts; from += fillChunk {
		to := min(from+fillChunk-1, inserts)
		if _, err := d.ExecContext(ctx, `INSERT INTO `+healthTable+` (document)
			SELECT jsonb_set($1::jsonb, '{healthevent,nodename}', to_jsonb('gpu-node-' || g || '.train-east-2.internal'))
			FROM generate_series($2::bigint, $3::bigint) g`, healthDocument, from, to); err != nil {
			return fmt.Errorf("fill health_events: %w", err)
		}
	}
	for done := 0; done < n/2; done += fillChunk {
		if _, err := d.ExecContext(ctx, `UPDATE `+healthTable+` SET document = `+healthUpdate+`
			WHERE id IN (SELECT id FROM `+healthTable+`
				WHERE document->'healtheventstatus'->'nodequarantined' = 'null'::jsonb LIMIT $1)`,
			min(fillChunk, n/2-done)); err != nil {
			return fmt.Errorf("update health_events: %w", err)
		}
	}
	return d.analyzeChangelog(ctx)
}
