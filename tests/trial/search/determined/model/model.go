// Package model: the experiment config accessors the sequencer calls; the unit arithmetic
// (length.go) is copied in from Determined by the generator.
package model

import "seqref/expconf"

const (
	AllCheckpointPolicy  = "all"
	BestCheckpointPolicy = "best"
	NoneCheckpointPolicy = "none"
)

type Checkpoint struct{}

type ExperimentConfig struct {
	InitialValidation bool
	Policy            string
	MinValidation     expconf.Length
	MinCheckpoint     expconf.Length
	SearcherUnit      expconf.Unit
	Rpe               int
	SchedulingUnitVal int
}

func (c ExperimentConfig) PerformInitialValidation() bool      { return c.InitialValidation }
func (c ExperimentConfig) CheckpointPolicy() string            { return c.Policy }
func (c ExperimentConfig) MinValidationPeriod() expconf.Length { return c.MinValidation }
func (c ExperimentConfig) MinCheckpointPeriod() expconf.Length { return c.MinCheckpoint }
func (c ExperimentConfig) Unit() expconf.Unit                  { return c.SearcherUnit }
func (c ExperimentConfig) RecordsPerEpoch() int                { return c.Rpe }
func (c ExperimentConfig) SchedulingUnit() int                 { return c.SchedulingUnitVal }

type Experiment struct {
	ID     int
	Config ExperimentConfig
}

type WorkloadManagerType string

const TrialWorkloadManagerType WorkloadManagerType = "TRIAL_WORKLOAD_MANAGER"

// RequestID: Determined's are random; here they count from 1 in the order trials are asked for,
// as loadstar's do.
type RequestID int

type WorkloadSequencerType string

const TrialWorkloadSequencerType WorkloadSequencerType = "TRIAL_WORKLOAD_SEQUENCER"

const (
	AggressiveMode   = "aggressive"
	StandardMode     = "standard"
	ConservativeMode = "conservative"
)
