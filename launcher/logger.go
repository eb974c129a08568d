package launcher

import (
	"fmt"
	"io"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// NewLogger returns gangrun's own logger, named "gangrun", at level info, writing to w:
// zap's console encoder (format "text") or JSON ("json"); another format is an error
// naming it.
func NewLogger(format string, w io.Writer) (*zap.Logger, error) {
	ec := zapcore.EncoderConfig{
		TimeKey: "ts", LevelKey: "level", NameKey: "logger", MessageKey: "msg",
		LineEnding: zapcore.DefaultLineEnding, EncodeLevel: zapcore.CapitalLevelEncoder,
		EncodeTime: zapcore.ISO8601TimeEncoder, EncodeDuration: zapcore.StringDurationEncoder,
		EncodeName: zapcore.FullNameEncoder,
	}
	var enc zapcore.Encoder
	switch format {
	case "text":
		enc = zapcore.NewConsoleEncoder(ec)
	case "json":
		enc = zapcore.NewJSONEncoder(ec)
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", format)
	}
	core := zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), zapcore.InfoLevel)
	return zap.New(core).Named("gangrun"), nil
}
