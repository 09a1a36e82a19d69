package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/api"
)

// openapiDoc is the served document, decoded.
type openapiDoc struct {
	raw   map[string]any
	paths map[string]any
}

func loadOpenAPI(t *testing.T, e *env) *openapiDoc {
	t.Helper()
	res := e.do("GET", "/v1/openapi.json", "", nil)
	if res.status != 200 || res.header.Get("Content-Type") != "application/json" {
		t.Fatalf("openapi.json: %d %s", res.status, res.header.Get("Content-Type"))
	}
	d := &openapiDoc{raw: res.json(t)}
	if d.raw["openapi"] != "3.1.0" {
		t.Errorf("openapi version %v", d.raw["openapi"])
	}
	d.paths = d.raw["paths"].(map[string]any)
	return d
}

// TestOpenAPIIgnoresQuery: the document is served as is whatever query
// the request carries, however malformed, as the probes do: it reads none,
// and answered 400 invalid_query to a client or a cache buster that added
// a bad escape. Its description lists no 400.
func TestOpenAPIIgnoresQuery(t *testing.T) {
	e := newEnv(t)
	want := e.do("GET", "/v1/openapi.json", "", nil)
	if want.status != 200 {
		t.Fatalf("openapi.json: %s", want)
	}
	for _, q := range []string{"?%zz", "?v=%", "?a;b=1", "?x=%00", "?%FF=1", "?format=yaml", "?t=1&t=2"} {
		res := e.do("GET", "/v1/openapi.json"+q, "", nil)
		if res.status != 200 || res.header.Get("Content-Type") != "application/json" || string(res.body) != string(want.body) {
			t.Errorf("openapi.json%s = %.200s; want 200 and the document", q, res)
		}
	}
}

// resolve follows a local $ref.
func (d *openapiDoc) resolve(v any) map[string]any {
	m, _ := v.(map[string]any)
	for m != nil {
		ref, ok := m["$ref"].(string)
		if !ok {
			return m
		}
		var cur any = d.raw
		for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			cur = cur.(map[string]any)[part]
		}
		m, _ = cur.(map[string]any)
	}
	return m
}

var methods = []string{"get", "post", "patch", "put", "delete"}

// operations lists "METHOD /path" of every documented operation.
func (d *openapiDoc) operations() []string {
	var out []string
	for p, item := range d.paths {
		for _, m := range methods {
			if _, ok := item.(map[string]any)[m]; ok {
				out = append(out, strings.ToUpper(m)+" "+p)
			}
		}
	}
	sort.Strings(out)
	return out
}

func (d *openapiDoc) operation(route string) map[string]any {
	method, path, _ := strings.Cut(route, " ")
	item, _ := d.paths[path].(map[string]any)
	op, _ := item[strings.ToLower(method)].(map[string]any)
	return op
}

// TestOpenAPIMatchesRoutes fails when a route is registered but not
// documented, documented but not registered, or documented in a way the mux
// does not route.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	e := newEnv(t)
	d := loadOpenAPI(t, e)
	registered := e.server.Routes()
	sort.Strings(registered)
	documented := d.operations()
	for _, r := range registered {
		if !slices.Contains(documented, r) {
			t.Errorf("route %s is not documented", r)
		}
	}
	for _, o := range documented {
		if !slices.Contains(registered, o) {
			t.Errorf("documented operation %s is not a route", o)
		}
		method, path, _ := strings.Cut(o, " ")
		sample := strings.NewReplacer("{id}", "x_1").Replace(path)
		if got := e.server.MuxPattern(httptest.NewRequest(method, sample, nil)); got != o {
			t.Errorf("%s %s is routed to %q", method, sample, got)
		}
		op := d.operation(o)
		if op["operationId"] == nil || op["summary"] == nil {
			t.Errorf("%s has no operationId or summary", o)
		}
		responses := op["responses"].(map[string]any)
		// Every path parameter is declared.
		var params []string
		for _, p := range asSlice(op["parameters"]) {
			pm := d.resolve(p)
			params = append(params, pm["in"].(string)+":"+pm["name"].(string))
			if pm["in"] == "header" && pm["name"] == "Idempotency-Key" && pm["required"] != true {
				t.Errorf("%s: Idempotency-Key is not required", o)
			}
		}
		// The query parameters documented are those the route takes (and
		// refuses others).
		var query []string
		for _, p := range params {
			if name, ok := strings.CutPrefix(p, "query:"); ok {
				query = append(query, name)
			}
		}
		taken := slices.Clone(e.server.RouteQuery(o))
		slices.Sort(query)
		slices.Sort(taken)
		if !slices.Equal(query, taken) {
			t.Errorf("%s documents query parameters %v; the route takes %v", o, query, taken)
		}
		if strings.Contains(path, "{id}") && !slices.Contains(params, "path:id") {
			t.Errorf("%s does not declare its id", o)
		}
		if method == "POST" {
			if !slices.Contains(params, "header:Idempotency-Key") {
				t.Errorf("%s does not document Idempotency-Key", o)
			}
			for _, s := range []string{"409", "422", "400"} {
				if responses[s] == nil {
					t.Errorf("%s does not document %s", o, s)
				}
			}
		}
		if sec, ok := op["security"]; !ok || len(asSlice(sec)) > 0 {
			if responses["401"] == nil || responses["429"] == nil {
				t.Errorf("%s needs a token but documents no 401 or 429", o)
			}
			// A 403 is documented where a role may be refused, and only
			// there: a client must not be told to handle what never comes.
			if forbids := e.server.RouteForbids(o); forbids != (responses["403"] != nil) {
				t.Errorf("%s documents a 403: %v; the route refuses roles: %v", o, responses["403"] != nil, forbids)
			}
			// Its token is looked up in the database, which may not answer.
			if responses["503"] == nil {
				t.Errorf("%s needs a token but documents no 503 (database_unavailable)", o)
			}
		}
	}
	// With Metrics configured, /metrics is served (outside the document).
	e2 := newEnv(t, func(c *api.Config) { c.Metrics = http.NotFoundHandler() })
	if !slices.Contains(e2.server.Routes(), "GET /metrics") {
		t.Error("GET /metrics not registered")
	}
}

// TestOpenAPIShapes sends requests to every route, with good and bad input,
// and checks each answer against the schema the document gives for its
// operation and status: the status must be documented, the keys of every
// object exactly the documented properties, the types and enums right.
func TestOpenAPIShapes(t *testing.T) {
	e := newEnv(t, func(c *api.Config) { c.MaxJobsPerProject = 3 })
	d := loadOpenAPI(t, e)
	covered := map[string]bool{}
	check := func(r req) *result {
		t.Helper()
		res, route := d.checkAnswer(t, e, r)
		covered[route] = true
		return res
	}

	check(req{method: "GET", path: "/healthz", token: "-"})
	check(req{method: "GET", path: "/readyz", token: "-"})
	check(req{method: "GET", path: "/v1/openapi.json", token: "-"})
	job := check(req{method: "POST", path: "/v1/jobs", body: jobBody(nil)}).json(t)
	id := job["id"].(string)
	check(req{method: "POST", path: "/v1/jobs", body: jobBody(map[string]any{"schedule": nil, "at": "2026-10-10T00:00:00Z"})})
	check(req{method: "POST", path: "/v1/jobs", body: `{"nope":1}`})
	check(req{method: "POST", path: "/v1/jobs/batch", body: map[string]any{"jobs": []any{jobBody(nil)}}})
	check(req{method: "POST", path: "/v1/jobs/batch", body: map[string]any{"jobs": []any{jobBody(map[string]any{"schedule": "bogus"})}}})
	check(req{method: "POST", path: "/v1/jobs", body: jobBody(nil), token: "-"})
	check(req{method: "POST", path: "/v1/jobs", body: strings.Repeat(" ", 70<<10)})
	check(req{method: "GET", path: "/v1/jobs"})
	check(req{method: "GET", path: "/v1/jobs?limit=1"})
	check(req{method: "GET", path: "/v1/jobs/" + id})
	check(req{method: "GET", path: "/v1/jobs/job_none"})
	check(req{method: "PATCH", path: "/v1/jobs/" + id, body: `{"timezone":"Asia/Tokyo","schedule":"0 9 * * 1-5"}`})
	check(req{method: "POST", path: "/v1/jobs/" + id + "/pause"})
	check(req{method: "POST", path: "/v1/jobs/" + id + "/resume"})
	check(req{method: "POST", path: "/v1/jobs/" + id + "/rotate-secret"})
	run := check(req{method: "POST", path: "/v1/jobs/" + id + "/runs"}).json(t)
	e.deliver(0)
	e.clock.Advance(time.Minute)
	e.deliver(200)
	check(req{method: "GET", path: "/v1/runs/" + run["id"].(string)})
	check(req{method: "GET", path: "/v1/runs/run_none"})
	check(req{method: "GET", path: "/v1/jobs/" + id + "/runs"})
	check(req{method: "GET", path: "/v1/jobs/" + id + "/runs?state=bogus"})
	check(req{method: "GET", path: "/v1/runs?jobId=" + id})
	check(req{method: "GET", path: "/v1/jobs/" + id + "/next?count=3"})
	check(req{method: "GET", path: "/v1/jobs/" + id + "/next?count=0"})
	check(req{method: "GET", path: "/v1/events"})
	check(req{method: "GET", path: "/v1/events?after=1&limit=2&type=run.retrying,run.succeeded&jobId=" + id})
	check(req{method: "GET", path: "/v1/events?type=run.nope"})
	sub := check(req{method: "POST", path: "/v1/subscriptions", body: `{"url":"https://example.test/events","types":["run.failed"]}`}).json(t)
	subID := sub["id"].(string)
	check(req{method: "POST", path: "/v1/subscriptions", body: `{"url":"http://10.0.0.1/events"}`})
	check(req{method: "GET", path: "/v1/subscriptions"})
	check(req{method: "GET", path: "/v1/subscriptions/" + subID})
	check(req{method: "GET", path: "/v1/subscriptions/sub_none"})
	check(req{method: "PATCH", path: "/v1/subscriptions/" + subID, body: `{"jobIds":["` + id + `"],"types":[]}`})
	check(req{method: "PATCH", path: "/v1/subscriptions/" + subID, body: `{"types":"run.failed"}`})
	check(req{method: "POST", path: "/v1/subscriptions/" + subID + "/rotate-secret"})
	check(req{method: "POST", path: "/v1/subscriptions/" + subID + "/reset"})
	check(req{method: "POST", path: "/v1/subscriptions/sub_none/reset"})
	p := check(req{method: "POST", path: "/v1/projects", body: `{"name":"shapes","retentionDays":30}`}).json(t)
	check(req{method: "GET", path: "/v1/projects"})
	check(req{method: "GET", path: "/v1/projects/" + p["id"].(string)})
	check(req{method: "GET", path: "/v1/projects/prj_none"})
	tk := check(req{method: "POST", path: "/v1/projects/" + p["id"].(string) + "/tokens", body: `{"name":"r","role":"read"}`}).json(t)
	check(req{method: "GET", path: "/v1/projects/" + p["id"].(string) + "/tokens"})
	check(req{method: "GET", path: "/v1/jobs", token: tk["token"].(string)})
	check(req{method: "DELETE", path: "/v1/jobs/" + id, token: tk["token"].(string)})
	// GET /v1/token: the caller's own token, its value never.
	if me := check(req{method: "GET", path: "/v1/token", token: tk["token"].(string)}).json(t); me["id"] != tk["id"] ||
		me["projectId"] != p["id"] || me["role"] != "read" || me["token"] != nil {
		t.Errorf("GET /v1/token: %v", me)
	}
	check(req{method: "DELETE", path: "/v1/tokens/" + tk["id"].(string)})
	// Conflicts: too many jobs, reuse of a key.
	check(req{method: "POST", path: "/v1/jobs", body: jobBody(nil)})
	check(req{method: "POST", path: "/v1/jobs", body: jobBody(nil)})
	check(req{method: "POST", path: "/v1/jobs", body: jobBody(nil), key: "dup"})
	check(req{method: "POST", path: "/v1/jobs", body: jobBody(map[string]any{"name": "x"}), key: "dup"})
	check(req{method: "DELETE", path: "/v1/jobs/" + id})
	for range vibejobs.MaxSubscriptionsPerProject {
		check(req{method: "POST", path: "/v1/subscriptions", body: `{"url":"https://example.test/events"}`})
	}
	check(req{method: "DELETE", path: "/v1/subscriptions/" + subID})
	check(req{method: "DELETE", path: "/v1/subscriptions/" + subID})

	for _, o := range d.operations() {
		if !covered[o] {
			t.Errorf("operation %s not exercised", o)
		}
	}
}

// checkAnswer sends r (as the installation administrator unless r.token
// says otherwise, "-" for none; a POST with a fresh Idempotency-Key unless
// r.key says otherwise) and checks the answer against the schema the
// document gives for its operation and status: the status must be
// documented, an error's code named by its description, the required
// headers there, and the body valid.
func (d *openapiDoc) checkAnswer(t *testing.T, e *env, r req) (*result, string) {
	t.Helper()
	if r.token == "" {
		r.token = e.admin
	}
	if r.token == "-" {
		r.token = ""
	}
	if r.method == "POST" && r.key == "" {
		r.key = keyAuto
	}
	res := e.send(r)
	u := strings.SplitN(r.path, "?", 2)[0]
	route := e.server.MuxPattern(httptest.NewRequest(r.method, u, nil))
	op := d.operation(route)
	if op == nil {
		t.Fatalf("%s %s: no documented operation %q", r.method, r.path, route)
	}
	resp := d.resolve(op["responses"].(map[string]any)[fmt.Sprint(res.status)])
	if resp == nil {
		t.Errorf("%s: status %d is not documented (%s)", route, res.status, res.body)
		return res, route
	}
	for h, hv := range asMap(resp["headers"]) {
		if asMap(hv)["required"] == true && res.header.Get(h) == "" {
			t.Errorf("%s %d: documented header %s missing", route, res.status, h)
		}
	}
	if res.status >= 400 {
		// An error's code is one its answer's description names; a 400's
		// may be a field-specific code, which the description leaves out.
		var body struct{ Error struct{ Code string } }
		json.Unmarshal(res.body, &body)
		desc, _ := resp["description"].(string)
		if res.status != 400 && !regexp.MustCompile(`\b`+regexp.QuoteMeta(body.Error.Code)+`\b`).MatchString(desc) {
			t.Errorf("%s %d: code %q is not among those documented: %s", route, res.status, body.Error.Code, desc)
		}
	}
	content := asMap(resp["content"])
	if len(content) == 0 {
		if len(res.body) != 0 {
			t.Errorf("%s %d: undocumented body %s", route, res.status, res.body)
		}
		return res, route
	}
	schema := asMap(asMap(content["application/json"])["schema"])
	var v any
	if err := json.Unmarshal(res.body, &v); err != nil {
		t.Errorf("%s %d: %v", route, res.status, err)
		return res, route
	}
	for _, p := range d.validate(schema, v, "$") {
		t.Errorf("%s %d: %s\n%s", route, res.status, p, res.body)
	}
	return res, route
}

// validate checks v against a small but strict subset of JSON Schema: $ref,
// type (one or a list), properties with additionalProperties false (every
// key documented) and required, items, enum, oneOf, pattern, minimum,
// maximum, minLength, maxLength, minItems and maxItems.
func (d *openapiDoc) validate(schema map[string]any, v any, at string) []string {
	schema = d.resolve(schema)
	if schema == nil {
		return []string{at + ": no schema"}
	}
	if alts, ok := schema["oneOf"]; ok {
		matched := 0
		for _, alt := range asSlice(alts) {
			if len(d.validate(asMap(alt), v, at)) == 0 {
				matched++
			}
		}
		if matched != 1 {
			return []string{fmt.Sprintf("%s: matches %d of oneOf", at, matched)}
		}
		return nil
	}
	if e, ok := schema["enum"]; ok && !slices.ContainsFunc(asSlice(e), func(x any) bool { return x == v }) {
		return []string{fmt.Sprintf("%s: %v not in enum %v", at, v, e)}
	}
	if tp, ok := schema["type"]; ok {
		var types []string
		switch x := tp.(type) {
		case string:
			types = []string{x}
		case []any:
			for _, y := range x {
				types = append(types, y.(string))
			}
		}
		if !slices.Contains(types, jsonType(v)) && !(jsonType(v) == "integer" && slices.Contains(types, "number")) {
			return []string{fmt.Sprintf("%s: %s, want %v", at, jsonType(v), types)}
		}
	}
	var problems []string
	bound := func(key string, n int, over bool) {
		if b, ok := schema[key].(float64); ok && (over && float64(n) > b || !over && float64(n) < b) {
			problems = append(problems, fmt.Sprintf("%s: %s is %v, got %d", at, key, b, n))
		}
	}
	switch x := v.(type) {
	case float64:
		if b, ok := schema["minimum"].(float64); ok && x < b {
			problems = append(problems, fmt.Sprintf("%s: %v under its minimum %v", at, x, b))
		}
		if b, ok := schema["maximum"].(float64); ok && x > b {
			problems = append(problems, fmt.Sprintf("%s: %v over its maximum %v", at, x, b))
		}
	case string:
		bound("minLength", utf8.RuneCountInString(x), false)
		bound("maxLength", utf8.RuneCountInString(x), true)
		if p, ok := schema["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(x) {
			problems = append(problems, fmt.Sprintf("%s: %q does not match %s", at, x, p))
		}
		if f, _ := schema["format"].(string); f == "date-time" {
			if _, err := time.Parse("2006-01-02T15:04:05.000Z", x); err != nil {
				problems = append(problems, fmt.Sprintf("%s: %q is not UTC RFC 3339 with ms", at, x))
			}
		}
	case map[string]any:
		props, ok := schema["properties"].(map[string]any)
		if !ok {
			break // a free-form object
		}
		if schema["additionalProperties"] != false {
			problems = append(problems, at+": schema allows undocumented properties")
		}
		for k, val := range x {
			ps, ok := props[k]
			if !ok {
				problems = append(problems, fmt.Sprintf("%s: undocumented key %q", at, k))
				continue
			}
			problems = append(problems, d.validate(asMap(ps), val, at+"."+k)...)
		}
		for _, r := range asSlice(schema["required"]) {
			if _, ok := x[r.(string)]; !ok {
				problems = append(problems, fmt.Sprintf("%s: required key %q missing", at, r))
			}
		}
	case []any:
		bound("minItems", len(x), false)
		bound("maxItems", len(x), true)
		if items, ok := schema["items"]; ok {
			for i, it := range x {
				problems = append(problems, d.validate(asMap(items), it, fmt.Sprintf("%s[%d]", at, i))...)
			}
		}
	}
	return problems
}

func jsonType(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case float64:
		if x == float64(int64(x)) {
			return "integer"
		}
		return "number"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "unknown"
}

func asMap(v any) map[string]any { m, _ := v.(map[string]any); return m }
func asSlice(v any) []any        { s, _ := v.([]any); return s }

var _ = vibejobs.RoleAdmin
