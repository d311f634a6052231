package gateway_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/gateway/gatewaytest"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// noHistory answers every history read with nothing.
type noHistory struct{}

func (noHistory) ListEvents(context.Context, string, *faultlinev1.ListEventsRequest) (*faultlinev1.ListEventsResponse, error) {
	return &faultlinev1.ListEventsResponse{}, nil
}

func (noHistory) ListActions(context.Context, string, *faultlinev1.ListActionsRequest) (*faultlinev1.ListActionsResponse, error) {
	return &faultlinev1.ListActionsResponse{}, nil
}

// TestConformanceScoreSlowBody: a POST /v1/conformance/score read its
// body after it had taken its read-rate token and one of the
// max_concurrent_reads slots, so max_concurrent_reads (4) connections
// that sent their headers and a few bytes of the body refused every read
// of every caller (429) until read_timeout. The body is now read first,
// like the other doors' bodies (in-flight budget, the credential's read
// share, Content-Type), and its reads wait for nothing else: another
// caller's reads are answered while the slow bodies dribble, and a slow
// body is refused, naming gateway.read_timeout, when its time is up.
func TestConformanceScoreSlowBody(t *testing.T) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	const readTimeout = 3 * time.Second
	gw := gatewaytest.Start(t, strings.Join(kc.ListenAddrs(), ","), func(c *gateway.Config) {
		c.ReadHeaderTimeout, c.ReadTimeout = time.Second, readTimeout
	}, gateway.Options{Conformance: countNodes{}, History: noHistory{}})

	const slow = 4 // gateway.max_concurrent_reads, its default
	answers := make(chan string, slow)
	start := time.Now()
	for range slow {
		c, err := net.Dial("tcp", gw.HTTPAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/conformance/score HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"+
			"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000000\r\n\r\nnodes=a", gw.Token("alpha"))
		go func() {
			_ = c.SetReadDeadline(time.Now().Add(readTimeout + 10*time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				answers <- err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			answers <- fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
		}()
	}
	time.Sleep(300 * time.Millisecond) // the slow bodies' headers are read

	for _, path := range []string{"/v1/conformance/score?nodes=a", "/v1/events", "/v1/actions"} {
		req, _ := http.NewRequest(http.MethodGet, gw.URL()+path, nil)
		req.Header.Set("Authorization", "Bearer "+gw.OperatorToken("alpha"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("another caller's GET %s while %d score bodies dribble: %d %s, want 200", path, slow, resp.StatusCode, b)
		}
	}
	if d := time.Since(start); d >= readTimeout {
		t.Fatalf("the reads took %s, past the slow bodies' read timeout (%s): the test proves nothing", d, readTimeout)
	}

	// A POST's body is admitted as the other doors': its Content-Type too.
	req, _ := http.NewRequest(http.MethodPost, gw.URL()+"/v1/conformance/score", strings.NewReader("nodes=a"))
	req.Header.Set("Authorization", "Bearer "+gw.OperatorToken("alpha"))
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnsupportedMediaType || !strings.Contains(string(b), "application/x-www-form-urlencoded") {
			t.Errorf("a score POST of application/json: %d %s, want 415 naming application/x-www-form-urlencoded", resp.StatusCode, b)
		}
	}

	for range slow {
		got := <-answers
		if !strings.HasPrefix(got, "408 ") || !strings.Contains(got, "gateway.read_timeout") {
			t.Errorf("a score body that did not arrive within read_timeout: %q, want 408 naming gateway.read_timeout", got)
		}
	}
}
