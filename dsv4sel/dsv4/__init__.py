"""What DeepSeek-V4 attention means to the engine: the profile (inputs, select
fields, flag spellings, wording), the query and selection types, capability
spellings, the nearest alternatives and machine detection."""
