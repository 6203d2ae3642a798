// Package ptrs: pointers to literals, as Determined's master/pkg/ptrs.
package ptrs

func IntPtr(v int) *int             { return &v }
func Float64Ptr(v float64) *float64 { return &v }
func BoolPtr(v bool) *bool          { return &v }
