package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/internal/egress"
)

// TestAcceptedURLIsDeliverable: a URL the API accepts is one a delivery
// can reach. The API stores the egress policy's normal form, in which every
// non-ASCII byte of the path is percent-encoded (3×), and every delivery
// checks the stored URL again: one that encoding made longer than 2048
// bytes was accepted, then every attempt ended "blocked".
func TestAcceptedURLIsDeliverable(t *testing.T) {
	e := newEnv(t) // egress policy opens 127.0.0.0/8, as in every API test
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer app.Close()
	client := deliveryClient(t)
	raw := app.URL + "/" + strings.Repeat("é", 600) // about 1222 bytes
	if len(raw) > 2048 {
		t.Fatalf("raw URL is %d bytes", len(raw))
	}
	for _, c := range []struct {
		what, path string
		body       map[string]any
	}{
		{"job", "/v1/jobs", jobBody(map[string]any{"url": raw})},
		{"subscription", "/v1/subscriptions", map[string]any{"url": raw}},
	} {
		res := e.do("POST", c.path, e.admin, c.body)
		if res.status == 400 && strings.Contains(res.String(), "invalid_url") {
			continue // refused at the API: fine
		}
		if res.status != 201 {
			t.Fatalf("%s: %s, want 201 or 400 invalid_url", c.what, res)
		}
		stored := res.json(t)["url"].(string)
		r := client.Post(context.Background(), stored, http.Header{}, []byte("{}"), 5*time.Second)
		if r.ErrorCode != "" {
			t.Errorf("%s: the API accepted a %d-byte URL (201) and stored %d bytes; delivering to it, with the app listening: error code %q (%v)",
				c.what, len(raw), len(stored), r.ErrorCode, r.Err)
		}
	}
}

// TestURLWithRawSpaceIsDeliverable: a query holding a raw space ("?a b")
// was stored as is, and every delivery wrote the request line
// "POST /hook?a b HTTP/1.1", which the app's HTTP server refuses with 400
// before any handler runs. The API must refuse such a URL or store it
// encoded.
func TestURLWithRawSpaceIsDeliverable(t *testing.T) {
	e := newEnv(t)
	var hits atomic.Int32
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer app.Close()
	client := deliveryClient(t)
	res := e.do("POST", "/v1/jobs", e.admin, jobBody(map[string]any{"url": app.URL + "/hook?team=a b"}))
	if res.status != 201 {
		t.Fatalf("create: %s", res)
	}
	stored := res.json(t)["url"].(string)
	r := client.Post(context.Background(), stored, http.Header{}, []byte("{}"), 5*time.Second)
	if hits.Load() != 1 || r.ErrorCode != "" {
		t.Errorf("the API stored %q (201); a delivery to it: status %d, error code %q; the app's handler ran %d times",
			stored, r.StatusCode, r.ErrorCode, hits.Load())
	}
}

// deliveryClient is the client deliveries go through, with loopback opened
// as in every API test.
func deliveryClient(t *testing.T) *egress.Client {
	t.Helper()
	policy, err := egress.NewPolicy([]string{"127.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	client, err := egress.NewClient(egress.Config{Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	return client
}
