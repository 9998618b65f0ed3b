// Package match compiles MongoDB-style $match pipelines into filters of change events: the
// compiler behind the root package's MatchFilter, MatchFilterJSON and Config.Pipeline. It
// works on event documents as maps and needs no database.
package match

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Compiler compiles pipelines. Its zero value compiles them as the root package's MatchFilter
// documents; StoreClient compiles them as the store-client's PostgreSQL filter evaluated them
// (see the root package's Config.StoreClientCompat).
type Compiler struct {
	// StoreClient: $exists never holds unless Extended is set, $gt, $gte, $lt and $lte hold
	// only between numbers, and {} as a value holds for any value.
	StoreClient bool
	// Extended: with StoreClient, $exists is evaluated, as for a pipeline the store-client
	// got wrapped by client.WithExtendedFilters.
	Extended bool
}

// Compile compiles the $match stages of pipeline into a filter of events E: the semantics and
// errors of the root package's MatchFilter (documented there), or, with c.StoreClient, of the
// store-client's filter. A pipeline without conditions gives a nil filter: no filter.
func Compile[E ~map[string]any](c Compiler, pipeline []map[string]any) (func(E) bool, error) {
	var stages []docMatcher
	for i, stage := range pipeline {
		if len(stage) != 1 {
			return nil, fmt.Errorf("pgchangestream: pipeline stage %d: want one key, $match, got %d keys", i, len(stage))
		}
		var name string
		var body any
		for name, body = range stage { // the one entry
		}
		if name != "$match" {
			return nil, fmt.Errorf("pgchangestream: pipeline stage %d: unsupported stage %q: only $match is supported", i, name)
		}
		cond, ok := body.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("pgchangestream: pipeline stage %d: $match takes an object, got %T", i, body)
		}
		m, err := c.condition(cond)
		if err != nil {
			return nil, fmt.Errorf("pgchangestream: pipeline stage %d: %w", i, err)
		}
		if len(cond) > 0 {
			stages = append(stages, m)
		}
	}
	if len(stages) == 0 {
		return nil, nil
	}
	return func(ev E) bool {
		for _, m := range stages {
			if !m(ev) {
				return false
			}
		}
		return true
	}, nil
}

// docMatcher tests one object (the event, or an object inside it).
type docMatcher func(doc map[string]any) bool

// valueMatcher tests the value found at a path; present is false for a missing field.
type valueMatcher func(v any, present bool) bool

// condition compiles {path: value, "$and": [...], "$or": [...]}: every entry must hold.
func (c Compiler) condition(cond map[string]any) (docMatcher, error) {
	parts := make([]docMatcher, 0, len(cond))
	for key, value := range cond {
		var m docMatcher
		var err error
		switch {
		case key == "$and" || key == "$or":
			m, err = c.logical(key, value)
		case strings.HasPrefix(key, "$"):
			err = fmt.Errorf("unsupported operator %q (supported: $and, $or, and per field $eq, $ne, $in, $gt, $gte, $lt, $lte, $exists)", key)
		default:
			m, err = c.field(key, value)
		}
		if err != nil {
			return nil, err
		}
		parts = append(parts, m)
	}
	return func(doc map[string]any) bool {
		for _, m := range parts {
			if !m(doc) {
				return false
			}
		}
		return true
	}, nil
}

// logical compiles "$and" or "$or" over a non-empty array of conditions.
func (c Compiler) logical(op string, value any) (docMatcher, error) {
	list, ok := asArray(value)
	if !ok || len(list) == 0 {
		return nil, fmt.Errorf("%s takes a non-empty array of conditions, got %s", op, describe(value))
	}
	parts := make([]docMatcher, len(list))
	for i, item := range list {
		cond, ok := item.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s[%d]: want a condition object, got %T", op, i, item)
		}
		m, err := c.condition(cond)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", op, i, err)
		}
		parts[i] = m
	}
	isOr := op == "$or" // $or: the first true decides; $and: the first false
	return func(doc map[string]any) bool {
		for _, m := range parts {
			if m(doc) == isOr {
				return isOr
			}
		}
		return !isOr
	}, nil
}

// field compiles the condition on one field path.
func (c Compiler) field(path string, value any) (docMatcher, error) {
	if path == "" {
		return nil, fmt.Errorf("empty field path")
	}
	m, err := c.value(value)
	if err != nil {
		return nil, fmt.Errorf("field %q: %w", path, err)
	}
	p := newFieldPath(path)
	return func(doc map[string]any) bool {
		v, ok := p.lookup(doc)
		return m(v, ok)
	}, nil
}

// value compiles the value given for a field: a plain value, an operator object or an
// object of nested field conditions.
func (c Compiler) value(value any) (valueMatcher, error) {
	obj, isObj := value.(map[string]any)
	if isObj && len(obj) == 0 && c.StoreClient {
		return func(any, bool) bool { return true }, nil
	}
	if !isObj || len(obj) == 0 {
		want, err := normalize(value)
		if err != nil {
			return nil, err
		}
		return func(v any, _ bool) bool { return equalsLoose(v, want) }, nil
	}
	operators := 0
	for key := range obj {
		if strings.HasPrefix(key, "$") {
			operators++
		}
	}
	switch operators {
	case 0:
		nested, err := c.condition(obj)
		if err != nil {
			return nil, err
		}
		return func(v any, _ bool) bool {
			doc, ok := v.(map[string]any)
			return ok && nested(doc)
		}, nil
	case len(obj):
		return c.operators(obj)
	default:
		return nil, fmt.Errorf("an object that mixes operators and fields")
	}
}

// operators compiles {"$op": operand, ...}: every operator must hold.
func (c Compiler) operators(ops map[string]any) (valueMatcher, error) {
	parts := make([]valueMatcher, 0, len(ops))
	for op, operand := range ops {
		m, err := c.operator(op, operand)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		parts = append(parts, m)
	}
	return func(v any, present bool) bool {
		for _, m := range parts {
			if !m(v, present) {
				return false
			}
		}
		return true
	}, nil
}

func (c Compiler) operator(op string, operand any) (valueMatcher, error) {
	switch op {
	case "$eq", "$ne":
		want, err := normalize(operand)
		if err != nil {
			return nil, err
		}
		negate := op == "$ne"
		return func(v any, _ bool) bool { return equalsLoose(v, want) != negate }, nil
	case "$in":
		list, ok := asArray(operand)
		if !ok {
			return nil, fmt.Errorf("want an array, got %s", describe(operand))
		}
		wants := make([]any, len(list))
		for i, item := range list {
			var err error
			if wants[i], err = normalize(item); err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
		}
		return func(v any, _ bool) bool {
			if v == nil {
				return false
			}
			for _, want := range wants {
				if equalsStrict(v, want) {
					return true
				}
			}
			return false
		}, nil
	case "$gt", "$gte", "$lt", "$lte":
		want, err := normalize(operand)
		if err != nil {
			return nil, err
		}
		switch want.(type) {
		case float64, string, time.Time:
		default:
			return nil, fmt.Errorf("want a number, a string or a time.Time, got %s", describe(operand))
		}
		if _, number := want.(float64); c.StoreClient && !number {
			return func(any, bool) bool { return false }, nil
		}
		accept := map[string]func(int) bool{
			"$gt": func(c int) bool { return c > 0 }, "$gte": func(c int) bool { return c >= 0 },
			"$lt": func(c int) bool { return c < 0 }, "$lte": func(c int) bool { return c <= 0 },
		}[op]
		return func(v any, _ bool) bool {
			c, ok := compareOrdered(v, want)
			return ok && accept(c)
		}, nil
	case "$exists":
		want, ok := operand.(bool)
		if !ok {
			return nil, fmt.Errorf("want true or false, got %s", describe(operand))
		}
		if c.StoreClient && !c.Extended {
			return func(any, bool) bool { return false }, nil
		}
		return func(_ any, present bool) bool { return present == want }, nil
	}
	return nil, fmt.Errorf("unsupported operator (supported per field: $eq, $ne, $in, $gt, $gte, $lt, $lte, $exists)")
}

// describe names a value's type for errors, JSON-style for decoded JSON.
func describe(v any) string {
	if v == nil {
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

// asArray returns the elements of the array types a pipeline may hold.
func asArray(v any) ([]any, bool) {
	switch v := v.(type) {
	case []any:
		return v, true
	case []string:
		out := make([]any, len(v))
		for i, s := range v {
			out[i] = s
		}
		return out, true
	case []map[string]any:
		out := make([]any, len(v))
		for i, m := range v {
			out[i] = m
		}
		return out, true
	}
	return nil, false
}

// normalize checks a value given in a pipeline and returns it with numbers as float64 and
// arrays as []any, so it compares with decoded JSON.
func normalize(v any) (any, error) {
	if f, ok := toFloat(v); ok {
		return f, nil
	}
	switch v := v.(type) {
	case nil, bool, string, time.Time:
		return v, nil
	case map[string]any:
		out := make(map[string]any, len(v))
		for key, item := range v {
			n, err := normalize(item)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", key, err)
			}
			out[key] = n
		}
		return out, nil
	}
	if list, ok := asArray(v); ok {
		out := make([]any, len(list))
		for i, item := range list {
			n, err := normalize(item)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			out[i] = n
		}
		return out, nil
	}
	return nil, fmt.Errorf("unsupported value type %T", v)
}

// toFloat converts Go and JSON numbers to float64.
func toFloat(v any) (float64, bool) {
	switch n := v.(type) {
	case float64:
		return n, true
	case float32:
		return float64(n), true
	case int:
		return float64(n), true
	case int8:
		return float64(n), true
	case int16:
		return float64(n), true
	case int32:
		return float64(n), true
	case int64:
		return float64(n), true
	case uint:
		return float64(n), true
	case uint8:
		return float64(n), true
	case uint16:
		return float64(n), true
	case uint32:
		return float64(n), true
	case uint64:
		return float64(n), true
	case json.Number:
		// A number beyond float64's range compares as an infinity.
		f, err := strconv.ParseFloat(string(n), 64)
		return f, err == nil || errors.Is(err, strconv.ErrRange)
	}
	return 0, false
}

// equalsLoose is equality for $eq, $ne and plain values: a missing or null field equals nil and
// false.
func equalsLoose(v, want any) bool {
	if v == nil {
		return want == nil || want == false
	}
	return equalsStrict(v, want)
}

// equalsStrict compares an event value with a normalized pipeline value.
func equalsStrict(v, want any) bool {
	if f, ok := toFloat(v); ok {
		w, ok := want.(float64)
		return ok && f == w
	}
	switch v := v.(type) {
	case nil:
		return want == nil
	case bool:
		w, ok := want.(bool)
		return ok && v == w
	case string:
		w, ok := want.(string)
		return ok && v == w
	case time.Time:
		w, ok := want.(time.Time)
		return ok && v.Equal(w)
	case map[string]any:
		w, ok := want.(map[string]any)
		if !ok || len(v) != len(w) {
			return false
		}
		for key, item := range v {
			wItem, ok := w[key]
			if !ok || !equalsStrict(item, wItem) {
				return false
			}
		}
		return true
	}
	list, ok := asArray(v)
	w, wok := want.([]any)
	if !ok || !wok || len(list) != len(w) {
		return false
	}
	for i := range list {
		if !equalsStrict(list[i], w[i]) {
			return false
		}
	}
	return true
}

// compareOrdered compares an event value with a number, string or time.Time; ok is false when
// their kinds differ or a number is NaN.
func compareOrdered(v, want any) (c int, ok bool) {
	switch w := want.(type) {
	case float64:
		f, ok := toFloat(v)
		if !ok || math.IsNaN(f) || math.IsNaN(w) {
			return 0, false
		}
		switch {
		case f < w:
			return -1, true
		case f > w:
			return 1, true
		}
		return 0, true
	case string:
		s, ok := v.(string)
		return strings.Compare(s, w), ok
	case time.Time:
		t, ok := v.(time.Time)
		return t.Compare(w), ok
	}
	return 0, false
}
