package pgchangestream

import (
	"encoding/json"

	gojson "github.com/goccy/go-json"
)

// unmarshalObject decodes the JSON text of a changelog column into doc, with the result and
// the error of encoding/json's Unmarshal into a map[string]any, about twice as fast.
//
// Objects that encoding/json's own validator accepts, which is every value PostgreSQL's jsonb
// gives, are decoded with github.com/goccy/go-json (strings copied, numbers float64, the last
// of duplicate keys wins, invalid UTF-8 replaced, as encoding/json does). Anything else takes
// encoding/json itself, so every input it rejects is rejected with its own error: the faster
// decoder's syntax checks differ in places and are never relied on.
// FuzzDecodeMatchesEncodingJSON holds the two paths to the same documents.
func unmarshalObject(data []byte) (doc map[string]any, err error) {
	if fastDecodable(data) {
		if err := gojson.Unmarshal(data, &doc); err == nil {
			return doc, nil
		}
		doc = nil
	}
	err = json.Unmarshal(data, &doc)
	return doc, err
}

// fastDecodable reports whether data is a JSON object that encoding/json accepts: the inputs
// given to the faster decoder.
func fastDecodable(data []byte) bool {
	for _, c := range data {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case '{':
			return json.Valid(data)
		}
		return false
	}
	return false
}
