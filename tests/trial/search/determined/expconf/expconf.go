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
