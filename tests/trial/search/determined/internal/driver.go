package internal

// The driver: random experiment configurations run through Determined's own sequencer
// (trial_workload_sequencer.go, copied in beside this file by the generator), the way the
// master's trial actor drives it (master/internal/trial.go@0.15.6): request the searcher's
// operations one after another, take Workload() until UpToDate(), complete each workload, and for
// a graceful stop report the workload as exited with USER_CANCELED (WorkloadFailed).

import (
	"math/rand"

	"seqref/expconf"
	"seqref/model"
	"seqref/searcher"
	"seqref/workload"
)

func checkpointFromCheckpointMetrics(workload.CheckpointMetrics) model.Checkpoint {
	return model.Checkpoint{}
}

// Case is one configuration and the stream Determined's sequencer gives for it.
type Case struct {
	GlobalBatchSize          int              `json:"global_batch_size"`
	RecordsPerEpoch          int              `json:"records_per_epoch"`
	SchedulingUnit           int              `json:"scheduling_unit"`
	MinValidationPeriod      map[string]int   `json:"min_validation_period"`
	MinCheckpointPeriod      map[string]int   `json:"min_checkpoint_period"`
	CheckpointPolicy         string           `json:"checkpoint_policy"`
	PerformInitialValidation bool             `json:"perform_initial_validation"`
	SearcherUnit             string           `json:"searcher_unit"`
	Ops                      []map[string]int `json:"ops"`
	// The index in Stream of the workload after which a graceful stop is requested; -1: none.
	StopAfter int `json:"stop_after"`
	// Each workload as [kind, step_id, num_batches, total_batches_processed, best]: kind T, V, C
	// or X (terminate: every operation done, or stopped; its total is the sequencer's total).
	// best is what the validation was told (whether it improved).
	Stream [][]interface{} `json:"stream"`
}

func unitName(u expconf.Unit) string {
	switch u {
	case expconf.Records:
		return "records"
	case expconf.Epochs:
		return "epochs"
	default:
		return "batches"
	}
}

func lengthJSON(l expconf.Length) map[string]int {
	return map[string]int{unitName(l.Unit): l.Units}
}

func kindLetter(k workload.Kind) string {
	switch k {
	case workload.RunStep:
		return "T"
	case workload.ComputeValidationMetrics:
		return "V"
	case workload.CheckpointModel:
		return "C"
	default:
		return "X"
	}
}

// randomLength draws a length in unit u of about `batches` batches (at least 1 after the floor).
func randomLength(r *rand.Rand, u expconf.Unit, batches, gbs, rpe int) expconf.Length {
	switch u {
	case expconf.Records:
		return expconf.Length{Unit: u, Units: batches*gbs + r.Intn(gbs)}
	case expconf.Epochs:
		epochs := (batches*gbs)/rpe + 1
		return expconf.Length{Unit: u, Units: epochs}
	default:
		return expconf.Length{Unit: u, Units: batches}
	}
}

func randomUnit(r *rand.Rand, rpe int) expconf.Unit {
	units := []expconf.Unit{expconf.Batches, expconf.Records}
	if rpe > 0 {
		units = append(units, expconf.Epochs)
	}
	return units[r.Intn(len(units))]
}

// Generate makes n cases from seed.
func Generate(seed int64, n int) []Case {
	r := rand.New(rand.NewSource(seed))
	var cases []Case
	for len(cases) < n {
		gbs := []int{1, 3, 16, 32, 100}[r.Intn(5)]
		rpe := 0
		if r.Intn(4) != 0 {
			rpe = gbs*(5+r.Intn(60)) + r.Intn(gbs)
		}
		su := []int{1, 2, 4, 7, 10, 25, 100}[r.Intn(7)]
		ctx := model.NewUnitContext(expconf.Batches, gbs, rpe)
		period := func() expconf.Length {
			if r.Intn(3) == 0 {
				return expconf.Length{Unit: expconf.Batches, Units: 0}
			}
			l := randomLength(r, randomUnit(r, rpe), 1+r.Intn(60), gbs, rpe)
			if ctx.ToNearestBatch(l) < 1 {
				return expconf.Length{Unit: expconf.Batches, Units: 0}
			}
			return l
		}
		config := model.ExperimentConfig{
			InitialValidation: r.Intn(4) == 0,
			Policy: []string{model.BestCheckpointPolicy, model.AllCheckpointPolicy,
				model.NoneCheckpointPolicy}[r.Intn(3)],
			MinValidation:     period(),
			MinCheckpoint:     period(),
			SearcherUnit:      randomUnit(r, rpe),
			Rpe:               rpe,
			SchedulingUnitVal: su,
		}
		// One to three operations in the searcher's unit, each further than the one before.
		var ops []expconf.Length
		last := 0
		for i, count := 0, 1+r.Intn(3); i < count; i++ {
			l := randomLength(r, config.SearcherUnit, last+1+r.Intn(120), gbs, rpe)
			b := ctx.ToNearestBatch(l)
			if b <= last {
				break
			}
			ops = append(ops, l)
			last = b
		}
		if len(ops) == 0 {
			continue
		}
		c := Case{
			GlobalBatchSize:          gbs,
			RecordsPerEpoch:          rpe,
			SchedulingUnit:           su,
			MinValidationPeriod:      lengthJSON(config.MinValidation),
			MinCheckpointPeriod:      lengthJSON(config.MinCheckpoint),
			CheckpointPolicy:         config.Policy,
			PerformInitialValidation: config.InitialValidation,
			SearcherUnit:             unitName(config.SearcherUnit),
			StopAfter:                -1,
		}
		stopAfter := -1
		if r.Intn(3) == 0 {
			stopAfter = r.Intn(last/su + 8)
		}
		exp := &model.Experiment{ID: 1, Config: config}
		s := newTrialWorkloadSequencer(exp, searcher.Create{Hparams: searcher.GbsSample(gbs)}, nil)
		s.SetTrialID(1)
		stopped := false
		for i, op := range ops {
			c.Ops = append(c.Ops, lengthJSON(op))
			s.OperationRequested(searcher.ValidateAfter{RequestID: 1, Length: op})
			for {
				// trial.go's sendNextWorkload: the sequencer's workload while it has one, then a
				// pre-close checkpoint of any batch not checkpointed, then terminate.
				var w workload.Workload
				if !s.UpToDate() {
					var err error
					if w, err = s.Workload(); err != nil {
						panic(err)
					}
				} else if preclose := s.PrecloseCheckpointWorkload(); preclose != nil {
					w = *preclose
				} else {
					break
				}
				best := false
				msg := workload.CompletedMessage{Workload: w}
				switch w.Kind {
				case workload.ComputeValidationMetrics:
					msg.ValidationMetrics = &workload.ValidationMetrics{}
					best = r.Intn(2) == 0
				case workload.CheckpointModel:
					msg.CheckpointMetrics = &workload.CheckpointMetrics{}
				}
				if len(c.Stream) == stopAfter {
					best = false
					reason := workload.UserCanceled
					msg.ExitedReason = &reason
					if _, err := s.WorkloadFailed(msg, reason); err != nil {
						panic(err)
					}
					c.StopAfter = stopAfter
					stopped = true
				} else if _, err := s.WorkloadCompleted(msg, func() bool { return best }); err != nil {
					panic(err)
				}
				c.Stream = append(c.Stream, []interface{}{kindLetter(w.Kind), w.StepID,
					w.NumBatches, w.PriorBatchesProcessed, best})
				if len(c.Stream) > 5000 {
					panic("a stream that does not end")
				}
			}
			c.Stream = append(c.Stream, []interface{}{"X", s.CurStepID, 0,
				s.TotalBatchesProcessed, false})
			if stopped {
				c.Ops = c.Ops[:i+1]
				break
			}
		}
		cases = append(cases, c)
	}
	return cases
}
