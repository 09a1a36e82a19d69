package web_test

import (
	"crypto/sha256"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
)

// invisible are format characters that change how the text around them
// renders, or hide in it: bidirectional embeddings, overrides, isolates and
// marks, zero-width characters, the BOM and the line and paragraph
// separators.
var invisible = []rune{
	'\u202a', '\u202b', '\u202c', '\u202d', '\u202e', '\u2066', '\u2067', '\u2068', '\u2069',
	'\u200e', '\u200f', '\u061c', '\u200b', '\u200d', '\u2060', '\ufeff', '\u00ad', '\u2028', '\u2029', '\u009b', '\u0085',
	'\U000e0041', // a tag character
}

// TestPagesShowInvisibleCharacters: a name holding a bidirectional override
// or another invisible format character is shown with the character spelt
// out (\u202e), so one job, project or token cannot pass for another.
// html/template escapes markup, not these.
func TestPagesShowInvisibleCharacters(t *testing.T) {
	e := newEnv(t)
	const spoof = "report\u202egpj.exe" // renders as "reportexe.jpg"
	var all strings.Builder
	for _, r := range invisible {
		all.WriteRune(r)
	}
	// The project and the token of the session have such names too.
	const projectID = "prj_bidi"
	const value = "vjt_DDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDD"
	sum := sha256.Sum256([]byte(value))
	e.update(func(tx vibejobs.Tx) error {
		if err := tx.CreateProject(e.ctx, &vibejobs.Project{ID: projectID, Name: "Alpha\u2067 Beta\u2069", CreatedAt: t0}); err != nil {
			return err
		}
		return tx.CreateToken(e.ctx, &vibejobs.Token{ID: "tok_bidi", ProjectID: projectID, Name: "ops\u200b",
			Role: vibejobs.RoleRead, Prefix: value[:12], Hash: sum[:], CreatedAt: t0}, vibejobs.MaxTokensPerProject)
	})
	j := e.job(projectID, named(spoof+" "+all.String()), func(j *vibejobs.Job) {
		j.URL = "https://app.example.test/\u202ehook"
	})
	r := e.deliver(j, t0.Add(-time.Hour), 500, "error\u202e: line one\nline\ttwo", vibejobs.Step{State: vibejobs.RunFailed, FailureReason: vibejobs.ReasonAttemptsExhausted})

	b := e.browser()
	b.login(value)
	pages := map[string]string{}
	for _, path := range []string{"/", "/jobs/" + j.ID, "/runs/" + r.ID} {
		a := b.get(path)
		if a.status != http.StatusOK {
			t.Fatalf("GET %s: %d", path, a.status)
		}
		pages[path] = a.body
		for _, r := range invisible {
			if strings.ContainsRune(a.body, r) {
				t.Errorf("GET %s: the page holds U+%04X as is", path, r)
			}
		}
	}
	for path, wants := range map[string][]string{
		"/":             {`report\u202egpj.exe`, `Alpha\u2067 Beta\u2069`, `ops\u200b`, `\U000e0041`},
		"/jobs/" + j.ID: {`<title>report\u202egpj.exe`, `<h1>report\u202egpj.exe`, `https://app.example.test/\u202ehook`},
		"/runs/" + r.ID: {`report\u202egpj.exe`, "error\\u202e: line one\nline\ttwo"},
	} {
		for _, want := range wants {
			if !strings.Contains(pages[path], want) {
				t.Errorf("GET %s: the page lacks %q", path, want)
			}
		}
	}
	// Other scripts are not format characters: they stay as they are.
	e.job(projectID, named("Bericht für مرحبا 日本"))
	if a := b.get("/"); !strings.Contains(a.body, "Bericht für مرحبا 日本") {
		t.Error("the jobs page changed a name without format characters")
	}
}
