package main

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// Secrets in URLs (a Redis URL's user:password) never reach a log line or
// an error: the URL is shown with its password replaced, and an error from
// parsing it is shown without the copy of the URL it may carry.

// redacted replaces a secret.
const redacted = "xxxxx"

// redactURL returns raw with the password of its userinfo replaced
// ("redis://user:xxxxx@host"); userinfo without a password, which some
// clients read as one, is replaced whole. It works on strings that do not
// parse as URLs too (a bad port, an unescaped character), since those are
// the ones that end up in error messages. Text without "scheme://...@" is
// returned unchanged.
func redactURL(raw string) string {
	start, end, ok := userinfoBounds(raw)
	if !ok {
		return raw
	}
	if user, _, hasPass := strings.Cut(raw[start:end], ":"); hasPass {
		return raw[:start] + user + ":" + redacted + raw[end:]
	}
	return raw[:start] + redacted + raw[end:]
}

// userinfoBounds finds the userinfo of raw: from "://" to the last '@'
// (url.Parse reads it so, and a password holding an unescaped '@' or '/'
// is then still covered).
func userinfoBounds(raw string) (start, end int, ok bool) {
	scheme := strings.Index(raw, "://")
	if scheme < 0 {
		return 0, 0, false
	}
	start = scheme + len("://")
	at := strings.LastIndex(raw[start:], "@")
	if at < 0 {
		return 0, 0, false
	}
	return start, start + at, true
}

// urlWithUserinfo finds "scheme://userinfo@" in free text.
var urlWithUserinfo = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#"'@]*@`)

// redactURLs redacts the userinfo of every URL in text: the last line of
// defence for messages built elsewhere (flag parse errors echo values).
func redactURLs(text string) string {
	return urlWithUserinfo.ReplaceAllStringFunc(text, redactURL)
}

// urlError is err, from parsing the URL given as flag, as a one-line error
// that shows the URL redacted and none of its secrets: a *url.Error echoes
// the whole URL, an escape error a piece of it.
func urlError(flag, raw string, err error) error {
	msg := err.Error()
	if ue, ok := errors.AsType[*url.Error](err); ok {
		msg = ue.Err.Error()
	}
	if _, ok := errors.AsType[url.EscapeError](err); ok {
		msg = "invalid URL escape (a '%' not followed by two hex digits)"
	}
	if start, end, ok := userinfoBounds(raw); ok {
		// Whatever else quotes the URL (or the password alone) loses them.
		info := raw[start:end]
		_, pass, _ := strings.Cut(info, ":")
		for _, secret := range []string{info, pass} {
			if secret != "" {
				msg = strings.ReplaceAll(msg, secret, redacted)
			}
		}
	}
	return fmt.Errorf("%s %s: %s", flag, redactURL(raw), redactURLs(msg))
}
