// Package helm holds the tests of the Helm chart in tether/ (a module of
// its own, as bench/ is, so that Helm's dependencies stay out of tether's
// go.mod).
package helm
