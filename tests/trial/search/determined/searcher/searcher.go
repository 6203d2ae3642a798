// Package searcher: stand-ins for the parts of Determined's searcher package that its asha.go,
// asha_stopping.go, adaptive_asha.go and tournament.go (copied in by the generator) and its
// sequencer use.
package searcher

import (
	"encoding/json"

	"seqref/expconf"
	"seqref/model"
	"seqref/workload"
)

type hparamSample map[string]interface{}

func (h hparamSample) GlobalBatchSize() int { return h["global_batch_size"].(int) }

// GbsSample is a sample with only a global batch size.
func GbsSample(gbs int) hparamSample { return hparamSample{"global_batch_size": gbs} }

// The hyperparameter draws and trial seeds are left out: loadstar draws its own.
type context struct {
	rand    *int
	hparams int
}

func sampleAll(int, *int) hparamSample { return hparamSample{} }

type Operation interface{}

type Create struct {
	RequestID model.RequestID
	Hparams   hparamSample
}

var lastRequestID model.RequestID

// ResetRequestIDs starts the request ids again from 1.
func ResetRequestIDs() { lastRequestID = 0 }

func NewCreate(_ *int, s hparamSample, _ model.WorkloadSequencerType) Create {
	lastRequestID++
	return Create{RequestID: lastRequestID, Hparams: s}
}

type ValidateAfter struct {
	RequestID model.RequestID
	Length    expconf.Length
}

func NewValidateAfter(id model.RequestID, length expconf.Length) ValidateAfter {
	return ValidateAfter{id, length}
}

type Close struct{ RequestID model.RequestID }

func NewClose(id model.RequestID) Close { return Close{id} }

type Shutdown struct{ Failure bool }

type SearchMethodType string

const (
	ASHASearch         SearchMethodType = "asha"
	AdaptiveASHASearch SearchMethodType = "adaptive_asha"
)

// SearchMethod as in search_method.go@0.15.6.
type SearchMethod interface {
	initialOperations(ctx context) ([]Operation, error)
	trialCreated(ctx context, requestID model.RequestID) ([]Operation, error)
	validationCompleted(ctx context, requestID model.RequestID, metric float64) ([]Operation, error)
	trialClosed(ctx context, requestID model.RequestID) ([]Operation, error)
	progress(map[model.RequestID]model.PartialUnits) float64
	trialExitedEarly(
		ctx context, requestID model.RequestID, exitedReason workload.ExitedReason,
	) ([]Operation, error)
	Snapshot() (json.RawMessage, error)
	Restore(state json.RawMessage) error
	Unit() expconf.Unit
}
