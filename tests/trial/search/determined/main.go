// Writes the streams of Determined's workload sequencer for random configurations as JSON.
package main

import (
	"encoding/json"
	"os"

	"seqref/internal"
)

func main() {
	out := json.NewEncoder(os.Stdout)
	if err := out.Encode(map[string]interface{}{"cases": internal.Generate(20261123, 150)}); err != nil {
		panic(err)
	}
}
