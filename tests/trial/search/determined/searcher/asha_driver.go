package searcher

// The driver: random adaptive_asha configurations run through Determined's own searcher
// (adaptive_asha.go, asha.go or with stop_once asha_stopping.go, tournament.go) by a simulated
// experiment that runs operations in order: a ValidateAfter becomes a validation event, a Close a
// close event (skipped for a trial already closed); trial_created is told of each Create as it is
// taken. A validation event of trial id at length n errors when (31 id + 7 n) % 23 == 0, raises
// InvalidHP when it is 1, and otherwise reports the metric ((7919 id + 104729 n) % 1000) / 1000;
// a trial that exits is closed at once. TrialClosed ends with Shutdown once every trial asked for
// has closed, as searcher.go's does.

import (
	"fmt"
	"math/rand"

	"seqref/expconf"
	"seqref/model"
	"seqref/workload"
)

// AshaCase is one configuration and the transcript of its search.
type AshaCase struct {
	MaxLength           int     `json:"max_length"`
	MaxTrials           int     `json:"max_trials"`
	Mode                string  `json:"mode"`
	Divisor             float64 `json:"divisor"`
	MaxRungs            int     `json:"max_rungs"`
	BracketRungs        []int   `json:"bracket_rungs"`
	MaxConcurrentTrials int     `json:"max_concurrent_trials"`
	SmallerIsBetter     bool    `json:"smaller_is_better"`
	// Determined's stopping variant (asha_stopping.go); left out of the JSON when false.
	StopOnce bool `json:"stop_once,omitempty"`
	// The brackets' rungs, trials and trials at once (getBracketMaxTrials and
	// getBracketMaxConcurrentTrials).
	Brackets             []int `json:"brackets"`
	BracketMaxTrials     []int `json:"bracket_max_trials"`
	BracketMaxConcurrent []int `json:"bracket_max_concurrent_trials"`
	// "Create 3", "ValidateAfter 3 12", "Close 3", "Shutdown", "Shutdown failure", the events
	// "Exit 3 errored" and "Exit 3 invalid", and "Progress 0.416666667" after each event (when
	// Determined's progress does not panic).
	Transcript []string `json:"transcript"`
}

type simulation struct {
	method     SearchMethod
	transcript []string
	events     []Operation
	requested  int
	closed     map[model.RequestID]bool
	failures   map[model.RequestID]bool
}

func (s *simulation) take(ops []Operation, err error) {
	if err != nil {
		panic(err)
	}
	for _, op := range ops {
		switch op := op.(type) {
		case Create:
			s.transcript = append(s.transcript, fmt.Sprintf("Create %d", op.RequestID))
			s.requested++
			if _, err := s.method.trialCreated(context{}, op.RequestID); err != nil {
				panic(err)
			}
		case ValidateAfter:
			s.transcript = append(s.transcript,
				fmt.Sprintf("ValidateAfter %d %d", op.RequestID, op.Length.Units))
			s.events = append(s.events, op)
		case Close:
			s.transcript = append(s.transcript, fmt.Sprintf("Close %d", op.RequestID))
			s.events = append(s.events, op)
		case Shutdown:
			if op.Failure {
				s.transcript = append(s.transcript, "Shutdown failure")
			} else {
				s.transcript = append(s.transcript, "Shutdown")
			}
		}
	}
}

func (s *simulation) close(id model.RequestID) {
	s.closed[id] = true
	ops, err := s.method.trialClosed(context{}, id)
	if s.requested == len(s.closed) {
		ops = append(ops, Shutdown{Failure: len(s.failures) >= s.requested})
	}
	s.take(ops, err)
}

func (s *simulation) progress() {
	defer func() { _ = recover() }()
	p := s.method.progress(nil)
	s.transcript = append(s.transcript, fmt.Sprintf("Progress %.9f", p))
}

// bracket gives the configuration and state of one of adaptive_asha's brackets, promoting or
// stopping.
func bracket(sub SearchMethod) (expconf.AsyncHalvingConfig, *asyncHalvingSearchState) {
	switch a := sub.(type) {
	case *asyncHalvingSearch:
		return a.AsyncHalvingConfig, &a.asyncHalvingSearchState
	case *asyncHalvingStoppingSearch:
		return a.AsyncHalvingConfig, &a.asyncHalvingSearchState
	}
	panic("a bracket that is no asynchronous successive halving")
}

// GenerateAsha makes n cases from seed, every one with searcher.stop_once set to stopOnce (the
// draws are the same either way).
func GenerateAsha(seed int64, n int, stopOnce bool) []AshaCase {
	r := rand.New(rand.NewSource(seed))
	var cases []AshaCase
	for len(cases) < n {
		c := AshaCase{
			MaxLength:       1 + r.Intn(400),
			MaxTrials:       1 + r.Intn(40),
			Mode:            []string{"aggressive", "standard", "conservative"}[r.Intn(3)],
			Divisor:         []float64{2, 3, 4, 2.5}[r.Intn(4)],
			MaxRungs:        1 + r.Intn(5),
			SmallerIsBetter: r.Intn(2) == 0,
			StopOnce:        stopOnce,
		}
		if r.Intn(5) == 0 {
			for i, count := 0, 1+r.Intn(3); i < count; i++ {
				c.BracketRungs = append(c.BracketRungs, 1+r.Intn(4))
			}
		}
		if r.Intn(2) == 0 {
			c.MaxConcurrentTrials = 1 + r.Intn(8)
		}
		config := expconf.AdaptiveASHAConfig{
			RawMaxLength:           expconf.NewLength(expconf.Batches, c.MaxLength),
			RawMaxTrials:           c.MaxTrials,
			RawMode:                expconf.AdaptiveMode(c.Mode),
			RawDivisor:             c.Divisor,
			RawMaxRungs:            c.MaxRungs,
			RawBracketRungs:        c.BracketRungs,
			RawMaxConcurrentTrials: c.MaxConcurrentTrials,
			RawStopOnce:            c.StopOnce,
		}
		ResetRequestIDs()
		method := newAdaptiveASHASearch(config, c.SmallerIsBetter).(*tournamentSearch)
		// A bracket whose rungs do not validate at increasing lengths (bracket_rungs with more
		// rungs than max_length allows) asks a trial for the same length twice, which Determined
		// cannot run (its master refuses an operation completed twice) and loadstar refuses.
		degenerate := false
		for _, sub := range method.subSearches {
			_, a := bracket(sub)
			for i := 1; i < len(a.Rungs); i++ {
				previous := a.Rungs[i-1].UnitsNeeded.Units
				if i > 1 {
					previous -= a.Rungs[i-2].UnitsNeeded.Units
				}
				if a.Rungs[i].UnitsNeeded.Units-a.Rungs[i-1].UnitsNeeded.Units <= previous {
					degenerate = true
				}
			}
		}
		if degenerate {
			continue
		}
		for _, sub := range method.subSearches {
			a, _ := bracket(sub)
			c.Brackets = append(c.Brackets, a.NumRungs())
			c.BracketMaxTrials = append(c.BracketMaxTrials, a.MaxTrials())
			c.BracketMaxConcurrent = append(c.BracketMaxConcurrent, a.MaxConcurrentTrials())
		}
		s := &simulation{method: method, closed: map[model.RequestID]bool{},
			failures: map[model.RequestID]bool{}}
		s.take(method.initialOperations(context{}))
		for len(s.events) > 0 {
			event := s.events[0]
			s.events = s.events[1:]
			switch e := event.(type) {
			case ValidateAfter:
				id, length := int(e.RequestID), e.Length.Units
				if s.closed[e.RequestID] {
					continue
				}
				switch (31*id + 7*length) % 23 {
				case 0:
					s.transcript = append(s.transcript, fmt.Sprintf("Exit %d errored", id))
					s.failures[e.RequestID] = true
					s.take(method.trialExitedEarly(context{}, e.RequestID, workload.Errored))
					s.close(e.RequestID)
				case 1:
					s.transcript = append(s.transcript, fmt.Sprintf("Exit %d invalid", id))
					s.take(method.trialExitedEarly(context{}, e.RequestID, workload.InvalidHP))
					s.close(e.RequestID)
				default:
					metric := float64((7919*id+104729*length)%1000) / 1000
					s.take(method.validationCompleted(context{}, e.RequestID, metric))
				}
			case Close:
				if s.closed[e.RequestID] {
					continue
				}
				s.close(e.RequestID)
			}
			s.progress()
			if len(s.transcript) > 20000 {
				panic("a search that does not end")
			}
		}
		c.Transcript = s.transcript
		cases = append(cases, c)
	}
	return cases
}
