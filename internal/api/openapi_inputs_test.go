package api_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/api"
)

// bodyCase is how TestOpenAPIRequestBodies sends one operation's body: the
// path to send it to and a body the handler accepts.
type bodyCase struct {
	path string
	base map[string]any
}

// goodValue is a value the handlers accept for a documented body property,
// by name, so that the property can be added to a valid body alone.
func goodValue(t *testing.T, name string, now time.Time) any {
	switch name {
	case "name":
		return "renamed"
	case "schedule":
		return "@hourly"
	case "at":
		return now.Add(48 * time.Hour).UTC().Format(time.RFC3339)
	case "timezone":
		return "Europe/Paris"
	case "url":
		return "https://example.test/other"
	case "enabled", "installation":
		return false
	case "timeout":
		return "5s"
	case "minBackoff":
		return "2s"
	case "maxBackoff":
		return "2h"
	case "maxAttempts":
		return 2
	case "catchUp":
		return "latest"
	case "retry":
		return map[string]any{}
	case "retentionDays":
		return 30
	case "role":
		return "read"
	case "types", "jobIds":
		return []any{}
	case "jobs":
		return []any{jobBody(nil)}
	}
	t.Fatalf("no good value for body property %q", name)
	return nil
}

// wrongType is a JSON value of another type than schema's.
func wrongType(schema map[string]any) any {
	switch schema["type"] {
	case "string":
		return 12
	case "array":
		return "x"
	}
	return "x" // integer, boolean, object
}

// TestOpenAPIRequestBodies walks every documented request body and checks
// the handler against it: a documented property is taken (a value of its
// type and within its bounds is accepted, one of another type refused
// naming the property, never as unknown_field), a required one is
// required, an undocumented one is refused (additionalProperties false),
// every enum value is accepted and another refused, and the documented
// minimum, maximum, minLength, maxLength, minItems and maxItems are the
// handler's.
func TestOpenAPIRequestBodies(t *testing.T) {
	e := newEnv(t)
	d := loadOpenAPI(t, e)
	now := e.clock.Now()
	job := e.createJob(e.admin, nil)["id"].(string)
	p := e.must(201, "POST", "/v1/projects", e.admin, map[string]any{"name": "bodies"})["id"].(string)
	sub := e.must(201, "POST", "/v1/subscriptions", e.admin, map[string]any{"url": "https://example.test/e"})["id"].(string)
	// A second job whose id a jobIds filter may name.
	job2 := e.createJob(e.admin, nil)["id"].(string)
	cases := map[string]bodyCase{
		"POST /v1/jobs":                             {"/v1/jobs", jobBody(nil)},
		"POST /v1/jobs/batch":                       {"/v1/jobs/batch", map[string]any{"jobs": []any{jobBody(nil)}}},
		"PATCH /v1/jobs/{id}":                       {"/v1/jobs/" + job, map[string]any{}},
		"POST /v1/jobs/{id}/pause":                  {"/v1/jobs/" + job + "/pause", map[string]any{}},
		"POST /v1/jobs/{id}/resume":                 {"/v1/jobs/" + job + "/resume", map[string]any{}},
		"POST /v1/jobs/{id}/rotate-secret":          {"/v1/jobs/" + job + "/rotate-secret", map[string]any{}},
		"POST /v1/jobs/{id}/runs":                   {"/v1/jobs/" + job + "/runs", map[string]any{}},
		"POST /v1/projects":                         {"/v1/projects", map[string]any{"name": "p"}},
		"POST /v1/projects/{id}/tokens":             {"/v1/projects/" + p + "/tokens", map[string]any{"name": "t", "role": "read"}},
		"POST /v1/subscriptions":                    {"/v1/subscriptions", map[string]any{"url": "https://example.test/e"}},
		"PATCH /v1/subscriptions/{id}":              {"/v1/subscriptions/" + sub, map[string]any{}},
		"POST /v1/subscriptions/{id}/rotate-secret": {"/v1/subscriptions/" + sub + "/rotate-secret", map[string]any{}},
		"POST /v1/subscriptions/{id}/reset":         {"/v1/subscriptions/" + sub + "/reset", map[string]any{}},
	}
	// exclusive names the property a body must drop to take another.
	exclusive := map[string]string{"at": "schedule"}

	send := func(route string, body map[string]any) *result {
		t.Helper()
		method, _, _ := strings.Cut(route, " ")
		res := e.send(req{method: method, path: cases[route].path, token: e.admin, body: body, key: keyAuto})
		// A subscription created is deleted again: a project holds 16.
		if loc := res.header.Get("Location"); res.status == 201 && strings.HasPrefix(loc, "/v1/subscriptions/") {
			e.must(204, "DELETE", loc, e.admin, nil)
		}
		return res
	}
	with := func(base map[string]any, key string, v any) map[string]any {
		b := maps.Clone(base)
		if other, ok := exclusive[key]; ok {
			delete(b, other)
		}
		b[key] = v
		return b
	}
	accepted := func(route, what string, res *result) {
		t.Helper()
		if res.status >= 300 {
			t.Errorf("%s with %s: %s; the document allows it", route, what, res)
		}
	}
	refused := func(route, what, field string, res *result) {
		t.Helper()
		if res.status != 400 {
			t.Errorf("%s with %s: %s; want 400 naming %s", route, what, res, field)
			return
		}
		// A documented property is known; an undocumented one is not.
		if code, f := res.errorCode(t); f != field || (code == "unknown_field") != strings.HasSuffix(field, "zzz") {
			t.Errorf("%s with %s: %s %s; want an error naming %s", route, what, code, f, field)
		}
	}

	for _, route := range d.operations() {
		op := d.operation(route)
		rb := asMap(op["requestBody"])
		if rb == nil {
			continue
		}
		c, ok := cases[route]
		if !ok {
			t.Errorf("%s: no body case", route)
			continue
		}
		schema := d.resolve(asMap(asMap(asMap(rb["content"])["application/json"])["schema"]))
		accepted(route, "its base body", send(route, c.base))
		if schema["additionalProperties"] != false {
			t.Errorf("%s: the body schema allows any property; the handlers refuse unknown ones", route)
		}
		refused(route, "an undocumented property", "zzz", send(route, with(c.base, "zzz", 1)))
		for _, r := range asSlice(schema["required"]) {
			b := maps.Clone(c.base)
			delete(b, r.(string))
			refused(route, "no "+r.(string), r.(string), send(route, b))
		}
		checkProperties(t, d, route, "", schema, now, func(path []string, v any) *result {
			var body map[string]any
			if len(path) == 1 {
				body = with(c.base, path[0], v)
			} else {
				body = with(c.base, path[0], map[string]any{path[1]: v})
			}
			return send(route, body)
		}, accepted, refused, e, job2)
	}
}

// checkProperties checks each property of the object schema at prefix
// through put, which sends a valid body with the property at path set to
// a value. Nested objects are walked one level down.
func checkProperties(t *testing.T, d *openapiDoc, route, prefix string, schema map[string]any, now time.Time,
	put func(path []string, v any) *result,
	accepted func(route, what string, res *result), refused func(route, what, field string, res *result),
	e *env, jobID string) {
	t.Helper()
	props := asMap(schema["properties"])
	for _, name := range slices.Sorted(maps.Keys(props)) {
		ps := d.resolve(asMap(props[name]))
		path := []string{name}
		if prefix != "" {
			path = []string{prefix, name}
		}
		field := strings.Join(path, ".")
		good := goodValue(t, name, now)
		accepted(route, field+"="+fmt.Sprint(good), put(path, good))
		refused(route, field+" of another type", field, put(path, wrongType(ps)))
		if ps["type"] == "object" {
			if ps["additionalProperties"] != false {
				t.Errorf("%s %s: allows any property", route, field)
			}
			refused(route, field+".zzz", field+".zzz", put(path, map[string]any{"zzz": 1}))
			checkProperties(t, d, route, name, ps, now, put, accepted, refused, e, jobID)
			continue
		}
		for _, v := range asSlice(ps["enum"]) {
			accepted(route, fmt.Sprintf("%s=%v", field, v), put(path, v))
		}
		if ps["enum"] != nil {
			refused(route, field+" outside its enum", field, put(path, "bogus"))
		}
		if f, _ := ps["format"].(string); f == "date-time" {
			refused(route, field+" not a date-time", field, put(path, "tomorrow"))
		}
		if n, ok := ps["minimum"].(float64); ok {
			accepted(route, fmt.Sprintf("%s=%v (its minimum)", field, n), put(path, n))
			refused(route, fmt.Sprintf("%s=%v (under its minimum)", field, n-1), field, put(path, n-1))
		}
		if n, ok := ps["maximum"].(float64); ok {
			accepted(route, fmt.Sprintf("%s=%v (its maximum)", field, n), put(path, n))
			refused(route, fmt.Sprintf("%s=%v (over its maximum)", field, n+1), field, put(path, n+1))
		}
		if n, ok := ps["minLength"].(float64); ok && n > 0 {
			refused(route, field+" shorter than its minLength", field, put(path, strings.Repeat("a", int(n)-1)))
		}
		if n, ok := ps["maxLength"].(float64); ok {
			long := func(n int) string { return strings.Repeat("a", n) }
			if name == "url" {
				long = func(n int) string {
					const base = "https://example.test/"
					return base + strings.Repeat("a", n-len(base))
				}
			}
			accepted(route, fmt.Sprintf("%s of %v characters (its maxLength)", field, n), put(path, long(int(n))))
			refused(route, fmt.Sprintf("%s of %v characters", field, n+1), field, put(path, long(int(n)+1)))
		}
		if ps["type"] == "array" {
			items := d.resolve(asMap(ps["items"]))
			// n valid items, distinct where the handler would merge them.
			itemsOf := func(n int) []any {
				out := make([]any, n)
				for i := range out {
					switch {
					case items["enum"] != nil:
						en := asSlice(items["enum"])
						out[i] = en[i%len(en)]
					case name == "jobIds":
						out[i] = jobID
					case name == "jobs":
						out[i] = jobBody(map[string]any{"name": "batch " + strconv.Itoa(i)})
					default:
						t.Fatalf("%s %s: no sample item", route, field)
					}
				}
				return out
			}
			if n, ok := ps["minItems"].(float64); ok && n > 0 {
				accepted(route, fmt.Sprintf("%s of %v items (its minItems)", field, n), put(path, itemsOf(int(n))))
				refused(route, fmt.Sprintf("%s of %v items", field, n-1), field, put(path, itemsOf(int(n)-1)))
			}
			if n, ok := ps["maxItems"].(float64); ok {
				accepted(route, fmt.Sprintf("%s of %v items (its maxItems)", field, n), put(path, itemsOf(int(n))))
				refused(route, fmt.Sprintf("%s of %v items", field, n+1), field, put(path, itemsOf(int(n)+1)))
			}
			if items["enum"] != nil {
				refused(route, field+" with an item outside its enum", field, put(path, []any{"bogus"}))
			}
		}
	}
}

// TestOpenAPIQueryParameters checks every documented query parameter
// against its route: an integer's minimum and maximum are accepted and
// the values past them refused naming it, every enum value is accepted and
// another refused, and a documented default is the one applied.
func TestOpenAPIQueryParameters(t *testing.T) {
	e := newEnv(t)
	d := loadOpenAPI(t, e)
	// 51 jobs, so that a default limit of 50 shows.
	jobs := make([]any, 51)
	for i := range jobs {
		jobs[i] = jobBody(map[string]any{"name": "q " + strconv.Itoa(i)})
	}
	created := e.must(201, "POST", "/v1/jobs/batch", e.admin, map[string]any{"jobs": jobs})
	job := asMap(asSlice(created["jobs"])[0])["id"].(string)
	pathOf := func(path string) string { return strings.ReplaceAll(path, "{id}", job) }
	for _, route := range d.operations() {
		method, path, _ := strings.Cut(route, " ")
		if method != "GET" || strings.Contains(path, "/projects/") {
			continue
		}
		for _, p := range asSlice(d.operation(route)["parameters"]) {
			pm := d.resolve(p)
			if pm["in"] != "query" {
				continue
			}
			name := pm["name"].(string)
			schema := d.resolve(asMap(pm["schema"]))
			get := func(v any) *result {
				return e.do("GET", pathOf(path)+"?"+url.Values{name: {fmt.Sprint(v)}}.Encode(), e.admin, nil)
			}
			ok := func(what string, res *result) {
				t.Helper()
				if res.status != 200 {
					t.Errorf("%s ?%s=%s: %s; the document allows it", route, name, what, res)
				}
			}
			bad := func(what string, res *result) {
				t.Helper()
				if res.status != 400 {
					t.Errorf("%s ?%s=%s: %s; want 400", route, name, what, res)
					return
				}
				if _, f := res.errorCode(t); f != name {
					t.Errorf("%s ?%s=%s: names %q, want %q", route, name, what, f, name)
				}
			}
			if n, has := schema["minimum"].(float64); has {
				ok(fmt.Sprint(n), get(n))
				bad(fmt.Sprint(n-1), get(n-1))
			}
			if n, has := schema["maximum"].(float64); has {
				ok(fmt.Sprint(n), get(n))
				bad(fmt.Sprint(n+1), get(n+1))
			}
			if schema["type"] == "integer" {
				bad("x", get("x"))
			}
			for _, v := range asSlice(schema["enum"]) {
				ok(fmt.Sprint(v), get(v))
			}
			if schema["enum"] != nil {
				bad("bogus", get("bogus"))
			}
			if def, has := schema["default"].(float64); has && name != "after" {
				// The default is the number of items when more are there.
				res := e.do("GET", pathOf(path), e.admin, nil)
				var got map[string]any
				if err := json.Unmarshal(res.body, &got); err != nil || res.status != 200 {
					t.Fatalf("%s: %s", route, res)
				}
				n := -1
				for _, k := range []string{"jobs", "times", "items"} {
					if l, has := got[k].([]any); has {
						n = len(l)
					}
				}
				if n >= 0 && n != int(def) {
					t.Errorf("%s without %s: %d items; the document's default is %v", route, name, n, def)
				}
			}
		}
	}
}

// TestOpenAPIErrorAnswers sends every documented operation the requests
// each kind of refusal answers, and checks the answers against the
// document (checkAnswer): no token or a bad one, a role that may not,
// an id that names nothing, an undocumented query parameter, a body too
// large, a POST without Idempotency-Key, a database that does not answer
// and a token past its rate.
func TestOpenAPIErrorAnswers(t *testing.T) {
	e, outage := newOutageEnv(t)
	d := loadOpenAPI(t, e)
	_, tokens := e.newProject("errors")
	// A valid body per operation, so that only the refusal under test is
	// at fault.
	bodyOf := func(route string) any {
		switch route {
		case "POST /v1/jobs":
			return jobBody(nil)
		case "POST /v1/jobs/batch":
			return map[string]any{"jobs": []any{jobBody(nil)}}
		case "POST /v1/projects":
			return map[string]any{"name": "p"}
		case "POST /v1/projects/{id}/tokens":
			return map[string]any{"name": "t", "role": "read"}
		case "POST /v1/subscriptions":
			return map[string]any{"url": "https://example.test/e"}
		}
		return map[string]any{}
	}
	seen := map[string]map[int]bool{}
	check := func(route string, r req) {
		t.Helper()
		res, got := d.checkAnswer(t, e, r)
		if got != route {
			t.Fatalf("%s %s went to %s", r.method, r.path, got)
		}
		if seen[route] == nil {
			seen[route] = map[int]bool{}
		}
		seen[route][res.status] = true
	}
	public := func(op map[string]any) bool {
		sec, ok := op["security"]
		return ok && len(asSlice(sec)) == 0
	}
	for _, route := range d.operations() {
		op := d.operation(route)
		method, path, _ := strings.Cut(route, " ")
		if public(op) {
			continue
		}
		p := strings.ReplaceAll(path, "{id}", "none_1")
		var body any
		if method == "POST" || method == "PATCH" {
			body = bodyOf(route)
		}
		r := func(edit func(*req)) req {
			x := req{method: method, path: p, body: body}
			if edit != nil {
				edit(&x)
			}
			return x
		}
		check(route, r(func(x *req) { x.token = "-" }))
		check(route, r(func(x *req) { x.token = "vjt_" + strings.Repeat("A", 43) }))
		check(route, r(func(x *req) { x.token = tokens[vibejobs.RoleRead] }))
		check(route, r(func(x *req) { x.path += "?zzz=1" }))
		if strings.Contains(path, "{id}") {
			check(route, r(nil))
		}
		if body != nil {
			check(route, r(func(x *req) { x.body = strings.Repeat(" ", 3<<20) }))
		}
		if method == "POST" {
			check(route, r(func(x *req) { x.key = "" }))
		}
		outage.Set("TokenByHash")
		check(route, r(nil))
		outage.Set()
	}
	// A token past its rate: every request after the first is refused.
	e2 := newEnv(t, func(c *api.Config) { c.RateLimit = api.RateLimit{PerSecond: 1e-6, Burst: 1} })
	e2.do("GET", "/v1/token", e2.admin, nil)
	for _, route := range d.operations() {
		method, path, _ := strings.Cut(route, " ")
		if public(d.operation(route)) {
			continue
		}
		res, _ := d.checkAnswer(t, e2, req{method: method, path: strings.ReplaceAll(path, "{id}", "none_1"), body: bodyOf(route)})
		if res.status != 429 {
			t.Errorf("%s past the token's rate: %s", route, res)
		}
	}
	for _, route := range d.operations() {
		if public(d.operation(route)) {
			continue
		}
		t.Logf("%s answered %v", route, slices.Sorted(maps.Keys(seen[route])))
	}
}
