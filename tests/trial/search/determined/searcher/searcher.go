// Package searcher: the operations Determined's sequencer reads.
package searcher

import "seqref/expconf"

type Hparams struct{ Gbs int }

func (h Hparams) GlobalBatchSize() int { return h.Gbs }

type Create struct{ Hparams Hparams }

type ValidateAfter struct {
	RequestID int
	Length    expconf.Length
}
