package match

import "strings"

// fieldPath is a dotted path, split once.
type fieldPath struct {
	path string
	dots []int // indexes of the dots in path
}

func newFieldPath(path string) fieldPath {
	p := fieldPath{path: path}
	for i := range len(path) {
		if path[i] == '.' {
			p.dots = append(p.dots, i)
		}
	}
	return p
}

// lookup finds the value at the path in doc. At each step it tries, on the current object, the
// longest key made of the remaining steps, then shorter ones down to the single step, then the
// single step ignoring case.
func (p fieldPath) lookup(doc map[string]any) (any, bool) {
	start, step := 0, 0 // path[start:] remains; it begins at step (index into dots+1)
	var cur any = doc
	for {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		found := false
		for end := len(p.dots); end >= step; end-- { // try path[start:stop]
			stop := len(p.path)
			if end < len(p.dots) {
				stop = p.dots[end]
			}
			if v, ok := m[p.path[start:stop]]; ok {
				if end == len(p.dots) {
					return v, true
				}
				cur, start, step, found = v, stop+1, end+1, true
				break
			}
		}
		if found {
			continue
		}
		stop := len(p.path)
		if step < len(p.dots) {
			stop = p.dots[step]
		}
		v, ok := lookupFold(m, p.path[start:stop])
		if !ok {
			return nil, false
		}
		if step == len(p.dots) {
			return v, true
		}
		cur, start, step = v, stop+1, step+1
	}
}

// lookupFold returns the value of the first key of m equal to key ignoring case, in key order
// so that the choice does not depend on map iteration.
func lookupFold(m map[string]any, key string) (any, bool) {
	best, found := "", false
	for k := range m {
		if strings.EqualFold(k, key) && (!found || k < best) {
			best, found = k, true
		}
	}
	if !found {
		return nil, false
	}
	return m[best], true
}
