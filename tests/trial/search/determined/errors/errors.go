// Package errors: the functions of github.com/pkg/errors that the sequencer calls.
package errors

import "fmt"

func New(message string) error { return fmt.Errorf("%s", message) }

func Errorf(format string, args ...interface{}) error { return fmt.Errorf(format, args...) }

func Wrap(err error, message string) error { return fmt.Errorf("%s: %w", message, err) }
