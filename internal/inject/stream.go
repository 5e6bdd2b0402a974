package inject

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"go.yaml.in/yaml/v3"
)

// A YAML stream is edited document by document. A document injection does
// not change is written back byte for byte; a changed one is re-encoded
// from its node tree (comments and field order kept) with the indentation
// it was written in. So a second run over the output changes nothing.

// chunk is one document's text: its `---` line (empty for a first document
// without one) and the lines up to the next `---`.
type chunk struct {
	sep, body string
	line      int // 1-based line of sep (or of body when sep is empty)
}

// splitDocuments cuts src at document markers. A line starting with `---`
// (alone, or followed by a space or tab) ends a document; YAML forbids that
// line inside any content, block scalars included.
func splitDocuments(src []byte) []chunk {
	var out []chunk
	cur := chunk{line: 1}
	line := 1
	for len(src) > 0 {
		end := bytes.IndexByte(src, '\n') + 1
		if end == 0 {
			end = len(src)
		}
		l := string(src[:end])
		src = src[end:]
		if isSeparator(l) {
			if cur.sep != "" || cur.body != "" {
				out = append(out, cur)
			}
			cur = chunk{sep: l, line: line}
		} else {
			cur.body += l
		}
		line++
	}
	if cur.sep != "" || cur.body != "" {
		out = append(out, cur)
	}
	return out
}

func isSeparator(line string) bool {
	line = strings.TrimRight(line, "\r\n")
	return line == "---" || strings.HasPrefix(line, "--- ") || strings.HasPrefix(line, "---\t")
}

// Stream injects into every workload of a YAML (or JSON) stream and
// returns the new stream with one Result per object. Objects without a pod
// template pass through untouched; an error (a malformed document, an
// unknown kind with a pod template, a bad annotation) stops everything, so
// that nothing half-injected is written.
func (inj Injector) Stream(src []byte) ([]byte, []Result, error) {
	var out bytes.Buffer
	var results []Result
	for i, ch := range splitDocuments(src) {
		text := ch.sep + ch.body
		docName := fmt.Sprintf("document %d (line %d)", i+1, ch.line)
		dec := yaml.NewDecoder(strings.NewReader(text))
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) || err == nil && (len(doc.Content) == 0 || isNull(doc.Content[0])) {
			out.WriteString(text) // comments or nothing
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %v", docName, err)
		}
		var extra yaml.Node
		if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
			return nil, nil, fmt.Errorf("%s: more than one document without a `---` between them", docName)
		}
		root := doc.Content[0]
		if root.Kind != yaml.MappingNode || scalar(mapGet(root, "kind")) == "" || scalar(mapGet(root, "apiVersion")) == "" {
			return nil, nil, fmt.Errorf("%s: not a Kubernetes object (no apiVersion and kind)", docName)
		}

		var rs []Result
		if scalar(mapGet(root, "kind")) == "List" {
			items := mapGet(root, "items")
			if items != nil && items.Kind == yaml.SequenceNode {
				for _, item := range items.Content {
					r, err := inj.injectObject(deref(item))
					if err != nil {
						return nil, nil, fmt.Errorf("%s: %w", docName, err)
					}
					rs = append(rs, r)
				}
			}
		} else {
			r, err := inj.injectObject(root)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", docName, err)
			}
			rs = append(rs, r)
		}
		results = append(results, rs...)

		changed := false
		for _, r := range rs {
			changed = changed || r.Action == actionInjected || r.Action == actionUpdated
		}
		if !changed {
			out.WriteString(text)
			continue
		}
		if ch.sep != "" {
			out.WriteString("---\n")
		}
		if err := encode(&out, &doc); err != nil {
			return nil, nil, fmt.Errorf("%s: %v", docName, err)
		}
	}
	return out.Bytes(), results, nil
}

// encode writes doc in the layout its source used.
func encode(w io.Writer, doc *yaml.Node) error {
	root := doc.Content[0]
	if root.Style&yaml.FlowStyle != 0 {
		blockStyle(doc) // JSON in, YAML out
	}
	indent, compact := layout(root)
	enc := yaml.NewEncoder(w)
	enc.SetIndent(indent)
	if compact {
		enc.CompactSeqIndent()
	}
	if err := enc.Encode(doc); err != nil {
		return err
	}
	return enc.Close()
}

// layout reads the indentation of a document from its nodes' positions:
// how far a nested mapping is indented, and whether a sequence's dashes sit
// at its key's column (kubectl's "compact" style) or further in. Nodes
// created by injection have no position and are skipped. Defaults: 2 and
// compact.
func layout(root *yaml.Node) (indent int, compact bool) {
	indent, compact = 0, true
	seqSeen := false
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if indent > 0 && seqSeen {
			return
		}
		if n.Kind == yaml.MappingNode && n.Style&yaml.FlowStyle == 0 {
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				if k.Line == 0 || v.Style&yaml.FlowStyle != 0 || len(v.Content) == 0 || v.Content[0].Line == 0 {
					continue
				}
				first := v.Content[0]
				switch v.Kind {
				case yaml.MappingNode:
					if indent == 0 && first.Line > k.Line && first.Column > k.Column {
						indent = first.Column - k.Column
					}
				case yaml.SequenceNode:
					if !seqSeen && first.Line > k.Line {
						seqSeen = true
						compact = first.Column-k.Column == 2
					}
				}
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(root)
	if indent < 2 || indent > 8 {
		indent = 2
	}
	return indent, compact
}

// isNull: a document of only comments decodes to an empty null scalar.
func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null" && n.Value == ""
}
