// Writes, as JSON, the streams of Determined's workload sequencer for random configurations
// (argument "sequencer") or the searches of its adaptive_asha searcher ("asha"; with stop_once,
// its stopping variant: "asha_stop_once").
package main

import (
	"encoding/json"
	"os"

	"seqref/internal"
	"seqref/searcher"
)

func main() {
	var cases interface{}
	switch {
	case len(os.Args) > 1 && os.Args[1] == "asha":
		cases = searcher.GenerateAsha(20261123, 120, false)
	case len(os.Args) > 1 && os.Args[1] == "asha_stop_once":
		cases = searcher.GenerateAsha(20261127, 120, true)
	default:
		cases = internal.Generate(20261123, 150)
	}
	if err := json.NewEncoder(os.Stdout).Encode(map[string]interface{}{"cases": cases}); err != nil {
		panic(err)
	}
}
