// Package workload: Determined's workload types (master/pkg/workload@0.15.6), as its sequencer
// uses them.
package workload

import "fmt"

type Kind string

const (
	RunStep                  Kind = "RUN_STEP"
	ComputeValidationMetrics Kind = "COMPUTE_VALIDATION_METRICS"
	CheckpointModel          Kind = "CHECKPOINT_MODEL"
	Terminate                Kind = "TERMINATE"
)

type Workload struct {
	Kind                  Kind `json:"kind"`
	ExperimentID          int  `json:"experiment_id"`
	TrialID               int  `json:"trial_id"`
	StepID                int  `json:"step_id"`
	NumBatches            int  `json:"num_batches"`
	PriorBatchesProcessed int  `json:"total_batches_processed"`
}

func (w Workload) String() string {
	return fmt.Sprintf("<%s %d batches after %d, step %d>", w.Kind, w.NumBatches,
		w.PriorBatchesProcessed, w.StepID)
}

type ExitedReason string

const (
	Errored      ExitedReason = "ERRORED"
	UserCanceled ExitedReason = "USER_CANCELED"
	InvalidHP    ExitedReason = "INVALID_HP"
)

type ValidationMetrics struct{}

type CheckpointMetrics struct{}

type CompletedMessage struct {
	Workload          Workload
	ValidationMetrics *ValidationMetrics
	CheckpointMetrics *CheckpointMetrics
	ExitedReason      *ExitedReason
}
