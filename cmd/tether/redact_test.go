package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"redis://user:pw@host:6379/0":         "redis://user:xxxxx@host:6379/0",
		"rediss://:pw@host:6380":              "rediss://:xxxxx@host:6380",
		"redis://pw@host":                     "redis://xxxxx@host",
		"redis://user:p@ss/w0rd@host:6379/1":  "redis://user:xxxxx@host:6379/1",
		"redis://host:6379/0":                 "redis://host:6379/0",
		"not a url":                           "not a url",
		"redis+sentinel://u:pw@h1:26379,h2/m": "redis+sentinel://u:xxxxx@h1:26379,h2/m",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
	text := `parse "redis://u:pw@h:x": invalid port; also rediss://:other@h2`
	if got := redactURLs(text); strings.Contains(got, "pw") || strings.Contains(got, "other") {
		t.Errorf("redactURLs left a password: %q", got)
	}
}

// A Redis URL's password never reaches an error or a log line, whatever is
// wrong with the URL (old main printed the whole URL: `--redis-url: parse
// "redis://user:password@...": invalid port`).
func TestRedisURLPasswordNeverShown(t *testing.T) {
	const secret = "s3cr3t-pw"
	bad := []string{
		"redis://admin:" + secret + "@127.0.0.1:notaport/0", // url.Parse echoes the URL
		"redis://" + secret + "@127.0.0.1:notaport",         // a lone userinfo
		"redis://admin:" + secret + "@127.0.0.1:6379/notadb",
		"redis://admin:" + secret + "@127.0.0.1:6379/0?dial_timeout=forever",
		"redis://admin:" + secret + "%zz@127.0.0.1:6379", // an escape error quotes a piece
		"redis://admin:a@" + secret + "/x@127.0.0.1:bad", // '@' and '/' in the password
		"nope://admin:" + secret + "@127.0.0.1",
		// Every malformed Sentinel and Cluster form.
		"redis+sentinel://admin:" + secret + "@127.0.0.1:26379,127.0.0.1:26380",    // no master name
		"redis+sentinel://admin:" + secret + "@127.0.0.1:26379/mymaster/x",         // bad db
		"redis+sentinel://admin:" + secret + "@127.0.0.1:26379/mymaster/0/extra",   // too long a path
		"redis+sentinel://admin:" + secret + "@127.0.0.1:26379,,127.0.0.1:1/m",     // empty host
		"redis+sentinel://admin:" + secret + "@127.0.0.1:99999/mymaster",           // bad port
		"redis+sentinel://admin:" + secret + "@/mymaster",                          // no host
		"redis+sentinel://admin:" + secret + "@127.0.0.1/mymaster?dial_timeout=1s", // no query
		"rediss+sentinel://admin:" + secret + "@127.0.0.1:0/mymaster",              // port 0
		"redis+cluster://admin:" + secret + "@127.0.0.1:7000,127.0.0.1:7001/0",     // no db in a cluster
		"redis+cluster://admin:" + secret + "@127.0.0.1:7000,127.0.0.1:x",          // bad port
		"redis+cluster://admin:" + secret + "@",                                    // no host
		"rediss+cluster://admin:" + secret + "@127.0.0.1:7000,",                    // empty host
	}
	for _, u := range bad {
		for _, via := range []string{"flag", "env"} {
			args := []string{"serve", "--backends", "http://127.0.0.1:1"}
			env := map[string]string{}
			if via == "flag" {
				args = append(args, "--redis-url", u)
			} else {
				env["TETHER_REDIS_URL"] = u
			}
			var out, errOut bytes.Buffer
			code := run(args, func(k string) string { return env[k] }, &out, &errOut)
			msg := errOut.String()
			if code != 1 || !strings.HasPrefix(msg, "tether: --redis-url") || strings.Count(msg, "\n") != 1 {
				t.Errorf("%s %q: exit %d, %q; want one line about --redis-url", via, u, code, msg)
			}
			if strings.Contains(msg, secret) || strings.Contains(msg, "zz@") {
				t.Errorf("%s %q: the password is shown: %q", via, u, msg)
			}
			if !strings.Contains(msg, redacted) {
				t.Errorf("%s %q: %q does not show where the password was", via, u, msg)
			}
		}

		var logs bytes.Buffer
		_, err := redisOptions(config{RedisURL: u}, slog.New(slog.NewTextHandler(&logs, nil)))
		if err == nil || strings.Contains(err.Error(), secret) || strings.Contains(logs.String(), secret) {
			t.Errorf("redisOptions(%q): %v, logs %q", u, err, logs.String())
		}
	}

	// A URL given to the wrong flag, or as a stray argument, is echoed by
	// the flag package or by tether: redacted too.
	for _, args := range [][]string{
		{"serve", "--max-body", "redis://admin:" + secret + "@h"},
		{"serve", "--backends", "http://127.0.0.1:1", "redis://admin:" + secret + "@h"},
	} {
		var out, errOut bytes.Buffer
		if code := run(args, func(string) string { return "" }, &out, &errOut); code != 1 || strings.Contains(errOut.String(), secret) {
			t.Errorf("%q: exit %d, %q", args, code, errOut.String())
		}
	}
}
