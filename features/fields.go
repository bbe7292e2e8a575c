package features

import "github.com/switchyard-llm/switchyard/internal/jsonscan"

// A request body is read in two passes (internal/jsonscan). The first
// validates the whole body as encoding/json would and notes where the
// top-level fields routing reads begin and end. The second renders the
// prompt from the noted field, trusting the syntax the first pass checked:
// it finds string ends and escapes with bytes.IndexByte and copies the runs
// between them whole. Neither builds a value tree, so the work is a few
// passes over memory and no allocation beyond the prompt buffer.

// Top-level fields, in the order encoding/json would report them.
const (
	fModel = iota
	fStream
	fStreamOptions
	fMaxTokens
	fMaxCompletionTokens
	fMessages
	fPrompt
	fInput
	fSystem
	fInstructions
	fMaxOutputTokens
	fPreviousResponseID
	fN
	fBestOf
	numFields
)

func fieldName(f int) string {
	switch f {
	case fModel:
		return "model"
	case fStream:
		return "stream"
	case fStreamOptions:
		return "stream_options"
	case fMaxTokens:
		return "max_tokens"
	case fMaxCompletionTokens:
		return "max_completion_tokens"
	case fMessages:
		return "messages"
	case fPrompt:
		return "prompt"
	case fInput:
		return "input"
	case fSystem:
		return "system"
	case fInstructions:
		return "instructions"
	case fMaxOutputTokens:
		return "max_output_tokens"
	case fPreviousResponseID:
		return "previous_response_id"
	case fN:
		return "n"
	case fBestOf:
		return "best_of"
	}
	return ""
}

// topField is the field a top-level key selects, as encoding/json selects
// struct fields, or -1.
func topField(k jsonscan.Key) int {
	if k.Plain {
		switch string(k.Quoted[1 : len(k.Quoted)-1]) {
		case "model":
			return fModel
		case "stream":
			return fStream
		case "stream_options":
			return fStreamOptions
		case "max_tokens":
			return fMaxTokens
		case "max_completion_tokens":
			return fMaxCompletionTokens
		case "messages":
			return fMessages
		case "prompt":
			return fPrompt
		case "input":
			return fInput
		case "system":
			return fSystem
		case "instructions":
			return fInstructions
		case "max_output_tokens":
			return fMaxOutputTokens
		case "previous_response_id":
			return fPreviousResponseID
		case "n":
			return fN
		case "best_of":
			return fBestOf
		}
	}
	for f := range numFields {
		if k.EqualFold(fieldName(f)) {
			return f
		}
	}
	return -1
}
