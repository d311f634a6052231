package janitor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
)

// A provider's call can fail in two ways that must not be told apart by
// the error's text. Either the request that carries the signal certainly
// did not reach the machine's controller — the dial was refused, the name
// did not resolve, TLS failed, an allowlist refused the address, or the
// controller answered (a status: 401, 404, 409, 500 …) — and nothing
// happened; or it was written whole and no answer was read — the answer
// timed out, the connection was cut (a BMC slow to answer a reset it
// carried out; the agent killed by the reboot it started; an EC2 answer
// lost) — and the machine may well be doing it. The second is
// ErrMaybeSent: the janitor treats it as a signal that may have gone out
// (SignalSent=True/MaybeSent), follows the node as for a sent signal, and
// never sends it again.

// ErrMaybeSent marks a provider error after which the signal may have
// gone out: its request was written whole and no answer was read.
var ErrMaybeSent = errors.New("the request was sent and no answer came back: it may have been carried out")

// maybeSentError is a provider error marked ErrMaybeSent; it keeps the
// provider's reason (errors.As a *ProviderError) for the message.
type maybeSentError struct{ err error }

func (e *maybeSentError) Error() string {
	return "sent, no answer (it may have been carried out): " + e.err.Error()
}
func (e *maybeSentError) Unwrap() error        { return e.err }
func (e *maybeSentError) Is(target error) bool { return target == ErrMaybeSent }

func maybeSent(err error) error { return &maybeSentError{err} }

// doTracked runs do (an http.Client's Do, a RoundTripper's RoundTrip) for
// r and says whether r was written whole and no answer read: the
// request's WroteRequest (httptrace) fired without an error, and do
// returned an error, no response. net/http waits for the writing
// goroutine before it returns a failed round trip, so a request it wrote
// has said so by then. A dial, DNS, TLS or allowlist failure happens
// before anything is written; an answer of any status is an answer.
//
// A request whose HTTP/2 stream the server reset REFUSED_STREAM (refused,
// when not nil, is set for it by the transport's CountError) was not
// processed at all (RFC 9113 §8.7): neither unanswered nor kept from the
// transport's own retry.
func doTracked(r *http.Request, refused *atomic.Bool, do func(*http.Request) (*http.Response, error)) (resp *http.Response, unanswered bool, err error) {
	var wrote atomic.Bool
	streamRefused := func() bool { return refused != nil && refused.Load() }
	if refused != nil {
		refused.Store(false)
	}
	ctx := httptrace.WithClientTrace(r.Context(), &httptrace.ClientTrace{
		WroteRequest: func(i httptrace.WroteRequestInfo) {
			if i.Err == nil {
				wrote.Store(true)
			}
		},
	})
	r = r.WithContext(ctx) // a copy: its GetBody is this call's
	if getBody := r.GetBody; getBody != nil {
		// Go's HTTP/2 transport sends a request again on its own when its
		// stream was reset REFUSED_STREAM or PROTOCOL_ERROR, or a GOAWAY
		// left it out, after it was written whole — whatever its method,
		// rewinding the body through GetBody: a signal the controller may
		// have carried out went out twice. Once written, it cannot be
		// rewound (the transport returns the error, read here as
		// unanswered) — unless the server refused the stream, which says
		// it processed nothing; one that failed before it was written
		// still can (HTTP/1's retry of a request on a connection found
		// closed).
		var refusals int
		r.GetBody = func() (io.ReadCloser, error) {
			if wrote.Load() {
				if !streamRefused() {
					return nil, errNotAgain
				}
				if refusals++; refusals > maxRefusedTries {
					// Refused again and again: the server takes nothing
					// now. Not sent (the refusal stands), and not tried
					// in a tight loop until the client's timeout — whose
					// end, falling on a try in flight, would leave that
					// try unanswered.
					return nil, errRefusedAgain
				}
				wrote.Store(false) // the next try is a try of its own
				refused.Store(false)
			}
			return getBody()
		}
	}
	resp, err = do(r)
	return resp, err != nil && resp == nil && wrote.Load() && !streamRefused(), err
}

// errNotAgain refuses to rewind a written signal's body for a replay.
var errNotAgain = errors.New("the request was written whole: it is not sent again")

// maxRefusedTries bounds the tries of a request the server refuses
// (REFUSED_STREAM) again and again: Go's HTTP/2 transport sends it again
// at once each time, hundreds of times a second.
const maxRefusedTries = 5

// errRefusedAgain ends the tries of a request refused maxRefusedTries times.
var errRefusedAgain = fmt.Errorf("the server refused the request's stream %d times: not sent", maxRefusedTries+1)

// sendProbe notes, for the requests made with its context through a
// sendTracker (a client whose requests are not the caller's: gofish's,
// the AWS SDK's), whether one was written and got no answer while armed.
type sendProbe struct {
	armed      atomic.Bool
	unanswered atomic.Bool
	// refused: the armed request's HTTP/2 stream was reset
	// REFUSED_STREAM (countH2Error, on a transport of the probe's own).
	refused atomic.Bool
}

// countH2Error is an HTTP/2 transport's CountError: it notes a stream
// the server refused. The transport calls it from its read loop before
// it fails the stream's round trip.
func (p *sendProbe) countH2Error(errType string) {
	if errType == "recv_rststream_REFUSED_STREAM" {
		p.refused.Store(true)
	}
}

type probeKey struct{}

// withSendProbe is ctx with a probe, armed or not.
func withSendProbe(ctx context.Context, armed bool) (context.Context, *sendProbe) {
	p := &sendProbe{}
	p.armed.Store(armed)
	return context.WithValue(ctx, probeKey{}, p), p
}

// arm starts counting requests (the ones before it do not: a login, a
// GET of the system).
func (p *sendProbe) arm() { p.unanswered.Store(false); p.armed.Store(true) }

// disarm stops counting requests and says whether one was written and
// got no answer while armed (a session login whose answer was lost).
func (p *sendProbe) disarm() bool { p.armed.Store(false); return p.unanswered.Swap(false) }

// sentUnanswered: an armed request was written and got no answer.
func (p *sendProbe) sentUnanswered() bool { return p.unanswered.Load() }

// track runs do for r, noting an unanswered request in r's probe.
func track(r *http.Request, do func(*http.Request) (*http.Response, error)) (*http.Response, error) {
	p, _ := r.Context().Value(probeKey{}).(*sendProbe)
	if p == nil || !p.armed.Load() {
		return do(r) // not the signal (a login, a GET): the transport may replay it
	}
	resp, unanswered, err := doTracked(r, &p.refused, do)
	if unanswered {
		p.unanswered.Store(true)
	}
	return resp, err
}

// sendTracker is a RoundTripper that reports to its request's probe. It
// sits inside an http.Client: the client's own timeout cancels the round
// trip, which then returns here (the client's error keeps only the text).
type sendTracker struct{ next http.RoundTripper }

func (s sendTracker) RoundTrip(r *http.Request) (*http.Response, error) {
	return track(r, s.next.RoundTrip)
}

// CloseIdleConnections is the next transport's.
func (s sendTracker) CloseIdleConnections() {
	if c, ok := s.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// trackingDoer is an HTTP client (the AWS SDK's aws.HTTPClient) that
// reports to its request's probe.
type trackingDoer struct {
	next interface {
		Do(*http.Request) (*http.Response, error)
	}
}

func (d trackingDoer) Do(r *http.Request) (*http.Response, error) { return track(r, d.next.Do) }

// onceSent keeps the SDK from trying a signal again once one try's
// request went out unanswered: the SDK retries a timeout or a cut
// connection, which would reboot the instance a second time.
type onceSent struct {
	aws.Retryer
	p *sendProbe
}

func (o onceSent) IsErrorRetryable(err error) bool {
	return !o.p.sentUnanswered() && o.Retryer.IsErrorRetryable(err)
}

// GetAttemptToken is the retryer's (aws.RetryerV2), else its initial token.
func (o onceSent) GetAttemptToken(ctx context.Context) (func(error) error, error) {
	if v2, ok := o.Retryer.(aws.RetryerV2); ok {
		return v2.GetAttemptToken(ctx)
	}
	return o.GetInitialToken(), nil //nolint:staticcheck // the SDK does the same for a Retryer that is not a RetryerV2
}
