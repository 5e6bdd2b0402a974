package inject

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"

	"go.yaml.in/yaml/v3"
)

// Helpers over yaml.Node: the YAML a user wrote is edited in place, so
// comments, field order and styles of everything tether does not own
// survive.

// deref follows an alias to its anchor.
func deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// mapGet returns the value of key in mapping m, or nil.
func mapGet(m *yaml.Node, key string) *yaml.Node {
	m = deref(m)
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return deref(m.Content[i+1])
		}
	}
	return nil
}

// mapPath follows keys from m.
func mapPath(m *yaml.Node, keys ...string) *yaml.Node {
	for _, k := range keys {
		m = mapGet(m, k)
	}
	return m
}

// mapSet sets key to v in mapping m: in place when the key exists, else
// before the key `before` when that exists, else at the end.
func mapSet(m *yaml.Node, key string, v *yaml.Node, before string) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content[i+1] = v
			return
		}
	}
	k := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == before {
			m.Content = slices.Insert(m.Content, i, k, v)
			return
		}
	}
	m.Content = append(m.Content, k, v)
}

// mapDelete removes key from mapping m.
func mapDelete(m *yaml.Node, key string) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content = slices.Delete(m.Content, i, i+2)
			return
		}
	}
}

// scalar returns n's value when it is a scalar, else "".
func scalar(n *yaml.Node) string {
	n = deref(n)
	if n == nil || n.Kind != yaml.ScalarNode {
		return ""
	}
	return n.Value
}

// stringMap reads a mapping of strings (labels, annotations).
func stringMap(m *yaml.Node) map[string]string {
	m = deref(m)
	out := map[string]string{}
	if m == nil || m.Kind != yaml.MappingNode {
		return out
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		out[m.Content[i].Value] = scalar(m.Content[i+1])
	}
	return out
}

// findNamed returns the index of the item of sequence s whose name is
// name, or -1.
func findNamed(s *yaml.Node, name string) int {
	if s == nil || s.Kind != yaml.SequenceNode {
		return -1
	}
	for i, item := range s.Content {
		if scalar(mapGet(item, "name")) == name {
			return i
		}
	}
	return -1
}

// plain decodes n into JSON-shaped Go values (maps, slices, json.Number,
// strings, bools), so that YAML and JSON spellings of one value compare
// equal.
func plain(n *yaml.Node) (any, error) {
	var v any
	if err := n.Decode(&v); err != nil {
		return nil, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return decodeJSON(b)
}

// decodeJSON decodes JSON with numbers kept as written (json.Number), so
// that no integer loses precision on its way through a patch.
func decodeJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var out any
	err := dec.Decode(&out)
	return out, err
}

// covers reports whether have already says everything want says: maps may
// carry more keys (the API server's defaults, such as
// terminationMessagePath), lists must match item by item.
func covers(have, want any) bool {
	switch w := want.(type) {
	case map[string]any:
		h, ok := have.(map[string]any)
		if !ok {
			return false
		}
		for k, wv := range w {
			hv, ok := h[k]
			if !ok || !covers(hv, wv) {
				return false
			}
		}
		return true
	case []any:
		h, ok := have.([]any)
		if !ok || len(h) != len(w) {
			return false
		}
		for i := range w {
			if !covers(h[i], w[i]) {
				return false
			}
		}
		return true
	default:
		return reflect.DeepEqual(have, want)
	}
}
