package h1

import (
	"net/http"
	"net/textproto"

	"golang.org/x/net/http/httpguts"
)

// Field is a header field: its name, canonical as net/http makes it, and
// its value.
type Field struct {
	Name, Value string
}

// Fields is a header as a list of fields in the order they came: what
// ReadAnswer reads an answer's header into, instead of an http.Header. A
// proxy reads a few of an answer's fields, changes one or two, and writes
// them all on: a list does that without a map's buckets and hashing, and
// parsed from a head it costs no allocation of its own (the values are
// substrings of the head).
//
// Its methods are http.Header's: a name is looked up in canonical form,
// Set replaces every field of the name by one, Del removes them all.
type Fields []Field

// canonical is textproto.CanonicalMIMEHeaderKey(name), without its walk
// of the name for the common names (the constants a proxy looks up):
// commonKeys are canonical.
func canonical(name string) string {
	if name != "" && common(name) >= 0 {
		return name
	}
	return textproto.CanonicalMIMEHeaderKey(name)
}

// Get returns the value of the first field named name, or "".
func (f Fields) Get(name string) string {
	name = canonical(name)
	for i := range f {
		if f[i].Name == name {
			return f[i].Value
		}
	}
	return ""
}

// Has reports whether a field is named name.
func (f Fields) Has(name string) bool {
	name = canonical(name)
	for i := range f {
		if f[i].Name == name {
			return true
		}
	}
	return false
}

// Count returns the number of fields named name.
func (f Fields) Count(name string) int {
	name = canonical(name)
	n := 0
	for i := range f {
		if f[i].Name == name {
			n++
		}
	}
	return n
}

// Values returns the values of the fields named name, in order, in a new
// slice; nil when there is none.
func (f Fields) Values(name string) []string {
	name = canonical(name)
	var vv []string
	for i := range f {
		if f[i].Name == name {
			vv = append(vv, f[i].Value)
		}
	}
	return vv
}

// Set makes value the only value of name: the first field of the name
// takes it, in its place, and the others are removed; a new field is added
// at the end when there is none.
func (f *Fields) Set(name, value string) {
	name = canonical(name)
	for i := range *f {
		if (*f)[i].Name == name {
			(*f)[i].Value = value
			f.delFrom(name, i+1)
			return
		}
	}
	*f = append(*f, Field{name, value})
}

// Del removes the fields named name.
func (f *Fields) Del(name string) {
	f.delFrom(canonical(name), 0)
}

// delFrom removes the fields of the canonical name from index from on;
// the others keep their order.
func (f *Fields) delFrom(name string, from int) {
	l := *f
	kept := from
	for i := from; i < len(l); i++ {
		if l[i].Name != name {
			l[kept] = l[i]
			kept++
		}
	}
	clear(l[kept:]) // no stale strings in the array
	*f = l[:kept]
}

// Header returns the fields as an http.Header, for code that needs a map.
func (f Fields) Header() http.Header {
	h := make(http.Header, len(f))
	f.AddTo(h)
	return h
}

// AddTo adds the fields to h, each value after those of its name in h.
// The value lists h has are not written into (they may be shared): a name
// h has gets a new list.
func (f Fields) AddTo(h http.Header) {
	// One array for the values of the names h has not, as net/http's
	// textproto does: a name seen once (almost every one) costs no list of
	// its own.
	values := make([]string, len(f))
	for i, fl := range f {
		if vv, ok := h[fl.Name]; ok {
			h[fl.Name] = append(vv[:len(vv):len(vv)], fl.Value)
			continue
		}
		values[i] = fl.Value
		h[fl.Name] = values[i : i+1 : i+1]
	}
}

// AppendHeader appends the fields of h to dst, each name's values in
// their order (the names in the map's, which is random). A name without
// values has no field.
func AppendHeader(dst Fields, h http.Header) Fields {
	for k, vv := range h {
		for _, v := range vv {
			dst = append(dst, Field{k, v})
		}
	}
	return dst
}

// containsToken reports whether a field named name (canonical) holds
// token in its comma-separated list, case-insensitively.
func (f Fields) containsToken(name, token string) bool {
	for i := range f {
		if f[i].Name == name && httpguts.HeaderValuesContainsToken([]string{f[i].Value}, token) {
			return true
		}
	}
	return false
}
