// Package expconf: the parts of Determined's expconf that its sequencer uses.
package expconf

// Unit is the type of unit for specifying lengths (Determined's spelling of epochs kept).
type Unit string

const (
	Records     Unit = "records"
	Batches     Unit = "batches"
	Epochs      Unit = "epoches"
	Unspecified Unit = "unspecified"
)

// Length is a training duration in terms of records, batches or epochs.
type Length struct {
	Unit  Unit
	Units int
}

// NewLength returns a length of `units` in `unit`.
func NewLength(unit Unit, units int) Length { return Length{Unit: unit, Units: units} }

// AdaptiveMode is adaptive_asha's mode.
type AdaptiveMode string

// AsyncHalvingConfig is one bracket's configuration, with Determined's field names.
type AsyncHalvingConfig struct {
	RawNumRungs            *int
	RawMaxLength           *Length
	RawMaxTrials           *int
	RawDivisor             *float64
	RawMaxConcurrentTrials *int
	RawStopOnce            *bool
}

func (c AsyncHalvingConfig) NumRungs() int            { return *c.RawNumRungs }
func (c AsyncHalvingConfig) MaxLength() Length        { return *c.RawMaxLength }
func (c AsyncHalvingConfig) MaxTrials() int           { return *c.RawMaxTrials }
func (c AsyncHalvingConfig) Divisor() float64         { return *c.RawDivisor }
func (c AsyncHalvingConfig) MaxConcurrentTrials() int { return *c.RawMaxConcurrentTrials }
func (c AsyncHalvingConfig) StopOnce() bool           { return *c.RawStopOnce }
func (c AsyncHalvingConfig) Unit() Unit               { return c.RawMaxLength.Unit }

// AdaptiveASHAConfig is searcher `adaptive_asha`, defaults applied.
type AdaptiveASHAConfig struct {
	RawMaxLength           Length
	RawMaxTrials           int
	RawMode                AdaptiveMode
	RawDivisor             float64
	RawMaxRungs            int
	RawBracketRungs        []int
	RawMaxConcurrentTrials int
	RawStopOnce            bool
}

func (c AdaptiveASHAConfig) MaxLength() Length        { return c.RawMaxLength }
func (c AdaptiveASHAConfig) MaxTrials() int           { return c.RawMaxTrials }
func (c AdaptiveASHAConfig) Mode() AdaptiveMode       { return c.RawMode }
func (c AdaptiveASHAConfig) Divisor() float64         { return c.RawDivisor }
func (c AdaptiveASHAConfig) MaxRungs() int            { return c.RawMaxRungs }
func (c AdaptiveASHAConfig) BracketRungs() []int      { return append([]int(nil), c.RawBracketRungs...) }
func (c AdaptiveASHAConfig) MaxConcurrentTrials() int { return c.RawMaxConcurrentTrials }
func (c AdaptiveASHAConfig) StopOnce() bool           { return c.RawStopOnce }
