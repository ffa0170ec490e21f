package app

import (
	"errors"
	"testing"

	"github.com/hashicorp/go-multierror"
)

// One error is returned as itself: its text is its own, not "1 error
// occurred: * ..." (issue #26); several are joined one a line, and each
// stays visible to errors.Is.
func TestJoinErrorsNoWrapperAroundOne(t *testing.T) {
	a, b := errors.New("flush producer: timeout"), errors.New("close store: disk full")
	if err := joinErrors(nil); err != nil {
		t.Errorf("no errors joined into %v", err)
	}
	if err := joinErrors([]error{a}); err != a {
		t.Errorf("one error joined into %q, want it as it is", err)
	}
	err := joinErrors([]error{a, b})
	if err.Error() != a.Error()+"\n"+b.Error() || !errors.Is(err, a) || !errors.Is(err, b) {
		t.Errorf("two errors joined into %q", err)
	}
	if err := oneError(multierror.Append(nil, a)); err != a {
		t.Errorf("oneError of a multierror of one: %q, want the error itself", err)
	}
	two := multierror.Append(nil, a, b)
	if err := oneError(two); err != two {
		t.Errorf("oneError of a multierror of two: %q, want it as it is", err)
	}
}
