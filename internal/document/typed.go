package document

import (
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	gojson "github.com/goccy/go-json"
)

// DecodeBytes decodes data, a JSON object that passes canonicalJSON, into v, and reports
// whether it could: whether decoding data gives v the value and the error-ness that decoding
// json.Marshal of its map gives, the round trip of UnmarshalMap. That holds when data
// passes canonicalJSON (every scalar is written as json.Marshal writes it, no two member names
// of an object fold to the same name, no name is changed by the round trip) and v's type passes
// plainType (only a scalar's bytes reach its decoders, never the spacing or member order of an
// object).
//
// A zero target whose type reaches no encoding.TextUnmarshaler but time.Time is decoded by
// github.com/goccy/go-json, which, for such texts and types, gives encoding/json's values when it
// succeeds (FuzzUnmarshalDocumentMatchesTheMapRoundTrip holds it to that); when it fails, the
// target is zeroed and encoding/json decodes it, so every error is encoding/json's own.
func DecodeBytes(data []byte, v any) (bool, error) {
	rv := reflect.ValueOf(v)
	if data == nil || rv.Kind() != reflect.Pointer || rv.IsNil() {
		return false, nil
	}
	t := rv.Type().Elem()
	info, ok := plainTargets.Load(t)
	if !ok {
		info, _ = plainTargets.LoadOrStore(t, inspectType(t, false, map[reflect.Type]bool{}))
	}
	p := info.(plainType)
	zero := rv.Elem().IsZero()
	if !p.plain || p.iface && !zero {
		return false, nil // an interface may hold a pointer to a json.Unmarshaler
	}
	if p.fast && zero {
		if err := gojson.Unmarshal(data, v); err == nil {
			return true, nil
		}
		rv.Elem().SetZero() // what the faster decoder filled in before it failed
	}
	return true, json.Unmarshal(data, v)
}

// plainTargets caches plainType by type.
var plainTargets sync.Map // reflect.Type -> plainType

// plainType is what DecodeBytes needs to know of a type.
type plainType struct {
	plain bool // no json.Unmarshaler other than time.Time can be reached
	iface bool // an interface can be reached other than as a map element
	fast  bool // plain, and no encoding.TextUnmarshaler other than time.Time can be reached
}

var (
	unmarshalerType     = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
	timeType            = reflect.TypeFor[time.Time]()
)

// inspectType walks t; inMap says t is a map's element type. seen holds the types on the way.
func inspectType(t reflect.Type, inMap bool, seen map[reflect.Type]bool) plainType {
	if t == timeType {
		return plainType{plain: true, fast: true}
	}
	if t.Kind() == reflect.Pointer { // its methods are those of the type it points to
		return inspectType(t.Elem(), inMap, seen)
	}
	if t.Implements(unmarshalerType) || reflect.PointerTo(t).Implements(unmarshalerType) {
		return plainType{}
	}
	if seen[t] {
		return plainType{plain: true, fast: true}
	}
	seen[t] = true
	defer delete(seen, t)
	fast := !t.Implements(textUnmarshalerType) && !reflect.PointerTo(t).Implements(textUnmarshalerType)
	join := func(a, b plainType) plainType {
		return plainType{plain: a.plain && b.plain, iface: a.iface || b.iface, fast: a.fast && b.fast}
	}
	switch t.Kind() {
	case reflect.Interface:
		return plainType{plain: true, iface: !inMap, fast: fast}
	case reflect.Slice, reflect.Array:
		return join(inspectType(t.Elem(), inMap, seen), plainType{plain: true, fast: fast})
	case reflect.Map:
		elem := inspectType(t.Elem(), true, seen)
		return join(inspectType(t.Key(), inMap, seen), plainType{plain: elem.plain, fast: fast && elem.fast})
	case reflect.Struct:
		p := plainType{plain: true, fast: fast}
		for i := range t.NumField() {
			p = join(p, inspectType(t.Field(i).Type, inMap, seen))
		}
		return p
	default:
		return plainType{plain: true, fast: fast}
	}
}

// UnmarshalMap is the root package's EventWithToken.UnmarshalDocument through a JSON round
// trip of the fullDocument map of ev: the reference the fast path is held to, and its fallback.
func UnmarshalMap(ev map[string]any, v any) error {
	full, ok := ev["fullDocument"]
	if !ok {
		return errors.New("pgchangestream: event has no fullDocument")
	}
	doc, ok := full.(map[string]any)
	if !ok {
		return fmt.Errorf("pgchangestream: fullDocument is %T, not an object", full)
	}
	doc = renameCreatedAt(doc) // a deep copy of the objects, so the event stays as it is
	if inner, ok := doc["document"].(map[string]any); ok {
		if id, ok := doc["id"]; ok {
			inner["_id"] = id
		}
		doc = inner
	}
	data, err := json.Marshal(doc)
	if err != nil {
		return fmt.Errorf("pgchangestream: encode fullDocument: %w", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("pgchangestream: decode fullDocument: %w", err)
	}
	return nil
}

// renameCreatedAt returns a copy of doc, and of the objects nested in it, with the key
// "createdat" renamed "createdAt", or dropped where "createdAt" is present.
func renameCreatedAt(doc map[string]any) map[string]any {
	out := make(map[string]any, len(doc))
	for key, value := range doc {
		if m, ok := value.(map[string]any); ok {
			value = renameCreatedAt(m)
		}
		if key == "createdat" {
			if _, taken := doc["createdAt"]; taken {
				continue // encoding/json would match either key to a createdAt field
			}
			key = "createdAt"
		}
		out[key] = value
	}
	return out
}
