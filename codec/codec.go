package codec

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"unsafe"
)

// Codec converts values of type T to and from bytes. Decode must not retain b.
// Decode returns an error (never panics) on bytes that are not an encoding of T.
type Codec[T any] interface {
	Encode(v T) ([]byte, error)
	Decode(b []byte) (T, error)
	// Name identifies the codec in describe output ("json", "string", "int64", ...).
	Name() string
}

type jsonCodec[T any] struct{}

// JSON returns a codec that encodes T with encoding/json. Decode refuses the
// JSON literal null unless T is a pointer, map, slice or interface type (whose
// nil Encode writes as null): encoding/json would decode it to T's zero value,
// an empty event that no producer of T meant to send.
func JSON[T any]() Codec[T] { return jsonCodec[T]{} }

func (jsonCodec[T]) Encode(v T) ([]byte, error) { return json.Marshal(v) }
func (jsonCodec[T]) Decode(b []byte) (T, error) {
	var v T
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) && !nullable[T]() {
		return v, fmt.Errorf("codec json: null is not a value of %T", v)
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return v, fmt.Errorf("codec json: %w", err)
	}
	return v, nil
}

// nullable reports whether encoding/json writes some value of T as null.
func nullable[T any]() bool {
	switch reflect.TypeFor[T]().Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Interface:
		return true
	}
	return false
}
func (jsonCodec[T]) Name() string { return "json" }

// Viewer is implemented by a codec whose encoding of a value is memory the
// value already holds (String: the bytes of the string). View returns that
// encoding without copying it; the caller must only read it, never write to
// it or keep it past the value's use (for String it is the memory of an
// immutable string). Topic.Send hands such views to the producer, which only
// reads them (Sarama copies keys and values into its request buffer), to
// spare a copy per key and value: on the stateless benchmark the String
// codec's copies were ~18% of the worker's allocations.
type Viewer[T any] interface {
	// View returns the encoding of v, as Encode would, without a copy.
	// Unlike Encode it cannot fail.
	View(v T) []byte
}

type stringCodec struct{}

// String returns a codec that stores a string as its UTF-8 bytes. It
// implements Viewer.
func String() Codec[string] { return stringCodec{} }

func (stringCodec) Encode(v string) ([]byte, error) { return []byte(v), nil }

// View implements Viewer: the bytes of v, not copied. The empty string's
// view is empty and not nil (a nil value is a tombstone to the producer).
func (stringCodec) View(v string) []byte {
	if len(v) == 0 {
		return []byte{}
	}
	return unsafe.Slice(unsafe.StringData(v), len(v))
}
func (stringCodec) Decode(b []byte) (string, error) { return string(b), nil }
func (stringCodec) Name() string                    { return "string" }

type bytesCodec struct{}

// Bytes returns a codec that passes bytes through (copying on decode).
func Bytes() Codec[[]byte] { return bytesCodec{} }

func (bytesCodec) Encode(v []byte) ([]byte, error) { return v, nil }
func (bytesCodec) Decode(b []byte) ([]byte, error) { return append([]byte(nil), b...), nil }
func (bytesCodec) Name() string                    { return "bytes" }

type int64Codec struct{}

// Int64 returns a codec that stores an int64 as 8 big-endian bytes (two's
// complement): the encoding of Kafka's LongSerializer and LongDeserializer
// and of Kafka Streams' Serdes.Long(), so a topic or table written by Runnel
// with it is read by a Java consumer with those, and the other way round.
// The byte order of non-negative values matches their numeric order. Use it
// for counters and sums that other Kafka clients read; use DecimalInt64 when
// people read the bytes (kafka-console-consumer prints "42", not 8 bytes).
func Int64() Codec[int64] { return int64Codec{} }

func (int64Codec) Encode(v int64) ([]byte, error) {
	return binary.BigEndian.AppendUint64(nil, uint64(v)), nil
}
func (int64Codec) Decode(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("codec int64: want 8 bytes, got %d", len(b))
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}
func (int64Codec) Name() string { return "int64" }

type int32Codec struct{}

// Int32 returns a codec that stores an int32 as 4 big-endian bytes (two's
// complement): the encoding of Kafka's IntegerSerializer and
// IntegerDeserializer and of Kafka Streams' Serdes.Integer().
func Int32() Codec[int32] { return int32Codec{} }

func (int32Codec) Encode(v int32) ([]byte, error) {
	return binary.BigEndian.AppendUint32(nil, uint32(v)), nil
}
func (int32Codec) Decode(b []byte) (int32, error) {
	if len(b) != 4 {
		return 0, fmt.Errorf("codec int32: want 4 bytes, got %d", len(b))
	}
	return int32(binary.BigEndian.Uint32(b)), nil
}
func (int32Codec) Name() string { return "int32" }

type decimalCodec struct{}

// DecimalInt64 returns a codec that stores an int64 as decimal text ("42"),
// readable by any Kafka tool and by people (kafka-console-consumer, `tables
// dump`), but not by a Java consumer with LongDeserializer: for what other
// Kafka clients read as a long, use Int64.
func DecimalInt64() Codec[int64] { return decimalCodec{} }

func (decimalCodec) Encode(v int64) ([]byte, error) { return strconv.AppendInt(nil, v, 10), nil }
func (decimalCodec) Decode(b []byte) (int64, error) {
	v, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("codec decimal int64: %w", err)
	}
	return v, nil
}
func (decimalCodec) Name() string { return "decimal" }
